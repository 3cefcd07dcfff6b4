"""The language model of multimodal checkpoints (nested ``text_config``,
``language_model.`` weights, vision towers ignored) against transformers' full
multimodal model run on text only, in both config layouts."""

import pytest

from arch_harness import VOCAB, run_family

TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256)
# A one-layer vision tower: its weights are in the checkpoint and must be ignored.
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              image_size=28, patch_size=14)
# Yarn with Llama 4's query temperature (beta 0.5 from position 16 on).
MINISTRAL3 = dict(TEXT, num_hidden_layers=2, max_position_embeddings=64, rope_parameters={
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
    "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
    "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5})
MROPE = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
QWEN_TEXT = dict(TEXT, num_hidden_layers=2, rope_parameters=MROPE, bos_token_id=1,
                 eos_token_id=2)
QWEN_VISION = dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=64,
                   num_heads=2, fullatt_block_indexes=[0])
QWEN3_MOE_TEXT = dict(QWEN_TEXT, head_dim=16, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=16, rope_parameters=dict(MROPE, mrope_interleaved=True))
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}

FAMILIES = {
    "gemma3": (dict(text_config=dict(TEXT, sliding_window=8, query_pre_attn_scalar=16,
                                     layer_types=["sliding_attention", "sliding_attention",
                                                  "full_attention"]),
                    vision_config=VISION, mm_tokens_per_image=4), WINDOWED),
    # Mistral 3 around a Ministral 3 text model (query temperature from position 16).
    "mistral3": (dict(text_config=dict(MINISTRAL3, model_type="ministral3"),
                      vision_config=dict(VISION, head_dim=16, image_size=28), spatial_merge_size=1),
                 WINDOWED),
    # M-RoPE sections over text positions: the plain rotation.
    "qwen2_vl": (dict(text_config=QWEN_TEXT, vision_config=dict(
        depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, spatial_merge_size=2)),
        {}),
    "qwen2_5_vl": (dict(text_config=QWEN_TEXT, vision_config=QWEN_VISION), {}),
    "qwen3_vl": (dict(text_config=dict(QWEN_TEXT, head_dim=16, rope_parameters=dict(
        MROPE, mrope_interleaved=True)), vision_config=dict(
        QWEN_VISION, deepstack_visual_indexes=[0], num_position_embeddings=16)), {}),
    "qwen3_vl_moe": (dict(text_config=QWEN3_MOE_TEXT, vision_config=dict(
        QWEN_VISION, deepstack_visual_indexes=[0], num_position_embeddings=16)), {}),
    "llava": (dict(text_config=dict(TEXT, model_type="llama"), vision_config=VISION,
                   vision_feature_layer=-1), {}),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_multimodal_text_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def test_hub_mrope_scaling_is_plain_rope():
    """Qwen 2 VL hub configs (transformers 4) carry ``rope_scaling`` of type mrope:
    on text that is the plain rotation, not an unknown RoPE type."""
    from mlx_lm_batched.models import qwen2_vl

    config = dict(QWEN_TEXT, model_type="qwen2_vl", rope_theta=10000.0,
                  rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    config.pop("rope_parameters")
    args = qwen2_vl.ModelArgs.from_dict(config)
    assert args.rope_scaling is None
    qwen2_vl.Model(args)  # builds with the plain rotation


def test_qwen3_vl_moe_hub_expert_layout_loads():
    """The hub's transposed fused experts give the same model as transformers' layout."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlx_lm_batched.models import qwen3_vl_moe

    config = dict(model_type="qwen3_vl_moe", text_config=QWEN3_MOE_TEXT, tie_word_embeddings=False)
    model = qwen3_vl_moe.Model(qwen3_vl_moe.ModelArgs.from_dict(config))
    E, H, I = 4, 64, 16
    gate_up = mx.random.normal((E, 2 * I, H), key=mx.random.key(0))
    down = mx.random.normal((E, H, I), key=mx.random.key(1))
    prefix = "model.language_model.layers.0.mlp.experts"
    ours = model.sanitize({f"{prefix}.gate_up_proj": gate_up, f"{prefix}.down_proj": down})
    hub = model.sanitize({f"{prefix}.gate_up_proj": gate_up.swapaxes(1, 2),
                          f"{prefix}.down_proj": down.swapaxes(1, 2)})
    assert sorted(ours) == sorted(hub) == [f"model.layers.0.mlp.switch_mlp.{n}.weight"
                                           for n in ("down_proj", "gate_proj", "up_proj")]
    for k in ours:
        assert mx.array_equal(ours[k], hub[k]), k
    shapes = dict(tree_flatten(model.parameters()))
    assert all(ours[k].shape == shapes[k].shape for k in ours)
