"""Architectures, part A (dense and small families): each against
transformers where it has the model, else mlx-lm 0.32 on the same tiny random
checkpoint (``tests/mlx_lm_oracle.py``), in both config layouts, with the harness's
four checks (padded logits, greedy rows, incremental decode, joining rows)."""

import mlx.core as mx
import pytest

from arch_harness import VOCAB, run_family

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
# mlx-lm's flat config (top-level RoPE keys) for families transformers lacks.
FLAT = dict(BASE, rope_theta=10000.0, rms_norm_eps=1e-6)
MLX_LM = {"oracle": "mlx_lm"}
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}
# DeepSeek V3's latent attention with dense MLPs (Youtu), and with its sigmoid-routed
# MoE from layer 1 on (Kimi's text model).
MLA_DENSE = dict(BASE, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, bos_token_id=1,
                 eos_token_id=2)
MLA = dict(MLA_DENSE, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
           n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
           routed_scaling_factor=2.5)
# A one-layer vision tower: its weights are in the checkpoint and must be ignored.
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


def kimi_k25_hub_names(directory):
    """transformers 5.24 saves Kimi K2.5 through its load-time renames run backwards,
    one of which (vision ``blocks`` -> ``layers``) also renames the text model's
    ``layers`` to ``blocks``; the hub checkpoints keep ``language_model.model.layers``."""
    import glob

    for path in glob.glob(f"{directory}/*.safetensors"):
        weights = mx.load(path)
        mx.save_safetensors(path, {k.replace("language_model.model.blocks.",
                                             "language_model.model.layers."): v
                                   for k, v in weights.items()}, metadata={"format": "pt"})


def positive_correction_bias(model):
    """Keep mlx-lm's router biases above zero, as trained ones are: mlx-lm scores the
    experts of dropped groups 0 (we drop them outright), so a negative biased score
    would rank a kept expert below them and the tie-break would decide."""
    for layer in model.language_model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and "e_score_correction_bias" in gate:
            gate.e_score_correction_bias = mx.abs(gate.e_score_correction_bias)


FAMILIES = {
    # GLM-4.5's MoE with Llama attention, every layer MoE.
    "solar_open": (dict(BASE, head_dim=16, moe_intermediate_size=32, n_routed_experts=4,
                        num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=1.5),
                   {}),
    # Remapped names: XVERSE is Llama (transformers' Llama saved as "xverse"), phi-msft
    # is Phixtral (mlx-lm's Phixtral as the oracle).
    "xverse": (dict(BASE, tie_word_embeddings=False), {"model_type": "llama",
                                                       "saved_model_type": "xverse"}),
    "phi-msft": (dict(num_vocab=VOCAB, model_dim=64, num_heads=4, num_layers=2, rotary_dim=8,
                      num_local_experts=4, num_experts_per_tok=2),
                 dict(MLX_LM, model_type="phixtral", saved_model_type="phi-msft")),
    # Parallel block, interleaved RoPE on the first 8 of 16 features per head.
    "gptj": (dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                  rotary_dim=8, n_inner=96), {}),
    # Looped blocks: 3 passes (two loss weights), the norm after each; or 2 passes, one norm.
    "nanbeige": (dict(FLAT, head_dim=16, loop_loss_weights=[0.5, 0.5]), MLX_LM),
    "nanbeige_one_norm": (dict(FLAT, num_loops=2, skip_loop_final_norm=True),
                          dict(MLX_LM, model_type="nanbeige")),
    "telechat3": (dict(FLAT, attention_bias=True, mlp_bias=True), MLX_LM),
    # Sliding and full layers with their own RoPE theta; dense layer 1, sparse 0 and 2.
    "mellum": (dict(BASE, num_hidden_layers=3, head_dim=16, num_experts=4,
                    num_experts_per_tok=2, moe_intermediate_size=32, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    mlp_layer_types=["sparse", "dense", "sparse"],
                    rope_parameters={"full_attention": {"rope_type": "default",
                                                        "rope_theta": 500000.0},
                                     "sliding_attention": {"rope_type": "default",
                                                           "rope_theta": 100.0}}), WINDOWED),
    # Layer 1 dense (mlp_only_layers); routed and shared experts mixed per token.
    "Klear": (dict(FLAT, num_hidden_layers=3, attention_bias=True, mlp_only_layers=[1],
                   num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                   n_shared_experts=2, moe_intermediate_size=32, norm_topk_prob=True),
              MLX_LM),
    # DeepSeek V3 attention, dense MLPs: transformers' "youtu", saved as the hub's
    # "youtu_llm" too.
    "youtu": (dict(MLA_DENSE, tie_word_embeddings=True), {}),
    "youtu_llm": (dict(MLA_DENSE, rope_interleave=False),
                  {"model_type": "youtu", "saved_model_type": "youtu_llm"}),
    # Weightless norms, QK-norm after RoPE, ReLU² MLP, soft-capped logits; nanochat's
    # own layout (negated rotation) through mlx-lm, whose norms use eps 1e-5.
    "nanochat": (dict(BASE, hidden_act="relu2", final_logit_softcapping=15.0), {}),
    "nanochat_own_layout": (dict(FLAT, rms_norm_eps=1e-5), dict(MLX_LM, model_type="nanochat")),
    # Llama with sub-norms and a ReLU² MLP (dense weights: the -bf16 checkpoints).
    "bitnet": (dict(BASE, head_dim=16), {}),
    # Per-layer head counts and MLP widths; one with an untied head.
    "openelm": (dict(vocab_size=VOCAB, model_dim=64, head_dim=16, num_transformer_layers=2,
                     num_query_heads=[4, 2], num_kv_heads=[2, 1], ffn_multipliers=[0.5, 1.5],
                     ffn_dim_divisor=16), MLX_LM),
    "openelm_untied": (dict(vocab_size=VOCAB, model_dim=64, head_dim=16, num_transformer_layers=2,
                            num_query_heads=[4, 4], num_kv_heads=[1, 2],
                            ffn_multipliers=[1.0, 0.5], ffn_dim_divisor=8,
                            normalize_qk_projections=False, share_input_output_layers=False,
                            rope_freq_constant=500.0), dict(MLX_LM, model_type="openelm")),
    # 8 query heads over 2 tiled key/value heads (reordered to grouped attention).
    "plamo": (dict(FLAT, num_attention_heads=8, n_shared_head=4), MLX_LM),
    "lille-130m": (dict(vocab_size=VOCAB, n_embd=64, n_head=4, n_kv_heads=2, n_layer=2,
                        block_size=256, layer_norm_eps=1e-5, rope_theta=10000.0), MLX_LM),
    # Layers 0, 2 sliding (window 7 + itself, local theta), 1 and 3 global.
    "plamo3": (dict(FLAT, num_hidden_layers=4, head_dim=16, window_size=7,
                    sliding_window_pattern=2, rope_local_theta=100.0), dict(MLX_LM, **WINDOWED)),
    "talkie": (dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    head_dim=16, intermediate_size=96, rope_theta=10000.0,
                    max_position_embeddings=256), MLX_LM),
    # Per-layer sublayers: regular (group sizes 2 and 4), linear replacements, no-ops.
    "nemotron-nas": (dict(FLAT, num_hidden_layers=4, block_configs=[
        {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"replace_with_linear": True}, "ffn": {"no_op": True}},
        {"attention": {"no_op": True}, "ffn": {"replace_with_linear": True}},
        {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 2.0}}]), MLX_LM),
    # Two passes; the second mixes global (first-pass) and windowed local attention.
    "iquestloopcoder": (dict(FLAT, head_dim=16, loop_window_size=8),
                        dict(MLX_LM, **WINDOWED)),
    # Vision-language checkpoints: the text model alone (image input is not supported).
    "lfm2-vl": (dict(text_config=dict(BASE, num_hidden_layers=3, block_multiple_of=16,
                                      layer_types=["conv", "full_attention", "conv"]),
                     vision_config=dict(VISION, num_patches=4), projector_hidden_size=32),
                {"model_type": "lfm2_vl", "saved_model_type": "lfm2-vl"}),
    "pixtral": (dict(text_config=dict(BASE, head_dim=16, model_type="mistral"),
                     vision_config=dict(VISION, model_type="pixtral", head_dim=16, image_size=28,
                                        patch_size=14)),
                {"model_type": "llava", "saved_model_type": "pixtral"}),
    "kimi_vl": (dict(text_config=dict(MLA, rope_theta=10000.0, rms_norm_eps=1e-6,
                                      model_type="deepseek_v3")),
                dict(MLX_LM, hf_hook=positive_correction_bias)),
    "kimi_k25": (dict(text_config=dict(MLA, model_type="deepseek_v3"),
                      vision_config=dict(VISION, patch_size=14, pos_emb_height=4, pos_emb_width=4,
                                         pos_emb_time=2)), {"rewrite": kimi_k25_hub_names}),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_wave3_family_matches_reference_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


@pytest.mark.parametrize("linear_class", ["bitlinear", "autobitlinear"])
def test_bitnet_packed_ternary_checkpoint_equals_its_dense_weights(tmp_path, linear_class):
    """A released-style BitNet checkpoint (ternary weights packed four to a byte,
    ``weight_scale``, ``quant_method: "bitnet"``) gives the logits of the same model
    stored dense; ``bitlinear`` divides by the scale, ``autobitlinear`` multiplies."""
    import json

    import numpy as np
    from mlx.utils import tree_flatten

    from arch_harness import make_prompts
    from mlx_lm_batched.layers.bitlinear import pack_ternary, unpack_ternary
    from mlx_lm_batched.utils import load_model

    config = dict(BASE, model_type="bitnet", head_dim=16, rms_norm_eps=1e-5)
    dense, packed = {}, {}
    from mlx_lm_batched.models import bitnet

    shapes = dict(tree_flatten(bitnet.Model(bitnet.ModelArgs.from_dict(config)).parameters()))
    for i, (name, p) in enumerate(sorted(shapes.items())):
        k = mx.random.key(i)
        linear = name.endswith("_proj.weight")
        if not linear:
            dense[name] = packed[name] = mx.random.normal(p.shape, key=k) * 0.3
            continue
        ternary = mx.random.randint(-1, 2, p.shape, key=k).astype(mx.float32)
        scale = 2.0 + i / 10
        dense[name] = ternary / scale if linear_class == "bitlinear" else ternary * scale
        packed[name] = pack_ternary(ternary)
        packed[name.replace(".weight", ".weight_scale")] = mx.array([scale])
        assert mx.array_equal(unpack_ternary(packed[name], p.shape[0]), ternary)
    for d, weights, extra in (("dense", dense, {}), ("packed", packed, {"quantization_config": {
            "quant_method": "bitnet", "linear_class": linear_class,
            "quantization_mode": "offline", "modules_to_not_convert": ["lm_head"]}})):
        (tmp_path / d).mkdir()
        mx.save_safetensors(str(tmp_path / d / "model.safetensors"), weights)
        (tmp_path / d / "config.json").write_text(json.dumps(dict(config, **extra)))
    ours_dense, _ = load_model(tmp_path / "dense")
    ours_packed, _ = load_model(tmp_path / "packed")
    assert ours_packed.layers[0].self_attn.q_proj.weight.dtype == mx.uint8
    for p in make_prompts((5, 9)):
        np.testing.assert_allclose(np.array(ours_packed(mx.array([p]))),
                                   np.array(ours_dense(mx.array([p]))), atol=1e-4, rtol=1e-4)


def test_tensor_parallel_splits_klear_and_refuses_the_layers_it_cannot_split():
    """Klear's blocks are the shared ones (its ``coefficient`` mixer stays whole on
    every rank); BitNet's sub-normed layers, IQuest-Coder Loop's gated stack and
    talkie's head-gained attention are refused with their name."""
    from mlx_lm_batched.models import bitnet
    from mlx_lm_batched.models import get_model_module
    from mlx_lm_batched.parallel.shard import shard_model
    from test_distributed import _TwoRanks

    klear = get_model_module("Klear")
    config = dict(FAMILIES["Klear"][0], model_type="Klear")
    model = shard_model(klear.Model(klear.ModelArgs.from_dict(config)), _TwoRanks())
    moe = model.layers[0].mlp
    assert moe.coefficient.weight.shape == (2, 64)
    assert moe.switch_mlp.gate_proj.weight.shape == (4, 16, 64)
    assert moe.shared_experts.down_proj.weight.shape == (64, 32)
    assert model.layers[0].self_attn.q_proj.weight.shape == (32, 64)

    config = dict(BASE, model_type="bitnet")
    with pytest.raises(ValueError, match=r"cannot shard layer 'model\.layers\.0\.self_attn' "
                                         r"\(SubNormAttention\): BitNet"):
        shard_model(bitnet.Model(bitnet.ModelArgs.from_dict(config)), _TwoRanks())
    loop = get_model_module("iquestloopcoder")
    config = dict(FAMILIES["iquestloopcoder"][0], model_type="iquestloopcoder")
    with pytest.raises(ValueError, match=r"'model' \(LoopStack\)"):
        shard_model(loop.Model(loop.ModelArgs.from_dict(config)), _TwoRanks())
    talkie = get_model_module("talkie")
    config = dict(FAMILIES["talkie"][0], model_type="talkie")
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn' \(HeadGainAttention\)"):
        shard_model(talkie.Model(talkie.ModelArgs.from_dict(config)), _TwoRanks())


@pytest.mark.parametrize("model_type,extra,message", [
    ("nanbeige", {"loop_share_kv": True}, "nanbeige: loop_share_kv is not supported"),
    ("iquestloopcoder", {"loop_num": 3}, "iquestloopcoder: loop_num=3 is not supported"),
    ("openelm", {"ffn_with_glu": False}, "openelm: ffn_with_glu=false"),
    ("bitnet", {"quantization_config": {"quant_method": "bitnet",
                                         "quantization_mode": "online"}},
     "bitnet: online quantization_mode is not supported"),
])
def test_unsupported_variants_are_refused_by_name(model_type, extra, message):
    """Config switches of the reference code that would change the output and that
    these modules do not implement raise one line naming them."""
    from mlx_lm_batched.models import get_model_module

    config = dict(FAMILIES[model_type][0], model_type=model_type, **extra)
    module = get_model_module(model_type)
    with pytest.raises(NotImplementedError, match=message):
        module.ModelArgs.from_dict(config)
