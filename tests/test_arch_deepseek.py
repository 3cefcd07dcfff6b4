"""DeepSeek V2/V3 (multi-head latent attention + MoE) against transformers on tiny
random configs, in both config layouts."""

import pytest
import torch

import arch_harness
from arch_harness import VOCAB, run_family

MLA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
           kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
           v_head_dim=12, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
           n_shared_experts=1, first_k_dense_replace=1)

# DeepSeek's yarn: mscale != mscale_all_dim exercises both the rotary mscale ratio and
# the squared mscale_all_dim softmax scale.
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}

def sharpen(model):
    """Make the oracle's weights exercise what the harness's weights hide.

    Tripling the query/key projections sharpens attention so that a wrong softmax
    scale moves the logits well past the tolerance. V3's correction bias is a
    buffer: randomise it with its own seed so it changes routing.
    """
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(f"self_attn.{n}." in name for n in ("q_proj", "q_b_proj", "kv_b_proj",
                                                        "kv_a_proj_with_mqa")):
                p.mul_(3.0)
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.2)
    return model


V3 = dict(MLA, n_group=2, topk_group=1, routed_scaling_factor=2.5)
FAMILIES = {
    "v2-greedy-no-q-lora": (dict(MLA, q_lora_rank=None, routed_scaling_factor=1.5),
                            dict(model_type="deepseek_v2", hf_hook=sharpen)),
    "v2-group-limited-yarn": (dict(MLA, topk_method="group_limited_greedy", n_group=2,
                                   topk_group=1, rope_scaling=YARN),
                              dict(model_type="deepseek_v2", hf_hook=sharpen)),
    "v3": (V3, dict(model_type="deepseek_v3", hf_hook=sharpen)),
    "v3-yarn-not-interleaved": (dict(MLA, n_group=2, topk_group=2, rope_scaling=YARN,
                                     rope_interleave=False, norm_topk_prob=False),
                                dict(model_type="deepseek_v3", hf_hook=sharpen)),
    # Per-layer dense/sparse choice.
    "glm4_moe_lite": (dict(MLA, n_group=1, topk_group=1, routed_scaling_factor=1.8,
                           mlp_layer_types=["sparse", "dense", "sparse"]),
                      dict(hf_hook=sharpen)),
    # mlx-lm's aliases of DeepSeek V3 checkpoints (Kimi K2, JoyAI LLM Flash).
    "kimi_k2": (V3, dict(model_type="deepseek_v3", saved_model_type="kimi_k2", hf_hook=sharpen)),
    "joyai_llm_flash": (V3, dict(model_type="deepseek_v3", saved_model_type="joyai_llm_flash",
                                 hf_hook=sharpen)),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_deepseek_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


@pytest.mark.parametrize("extra", [{}, {"truncate": False}, {"factor": None}])
def test_yarn_frequencies_match_transformers(extra):
    import numpy as np
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mlx_lm_batched.layers.rope import make_rope

    params = dict(YARN, rope_theta=10000.0, **extra)
    config = DeepseekV3Config(**dict(MLA, max_position_embeddings=512, rope_parameters=params))
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    rope = make_rope(MLA["qk_rope_head_dim"], 10000.0, True, params, 512)
    np.testing.assert_allclose(1 / np.array(rope._freqs), inv_freq.numpy(), rtol=1e-6)
    assert abs(rope.mscale - attention_factor) < 1e-12


def test_sanitize_fused_experts_and_mtp_layers():
    """transformers 5's in-memory layout (fused gate_up_proj) loads too, and V3's
    multi-token-prediction layers past num_hidden_layers are dropped."""
    import mlx.core as mx
    import numpy as np

    from mlx_lm_batched.models import deepseek_v3

    hf = sharpen(arch_harness.build_hf_model("deepseek_v3", V3))
    weights = {k: mx.array(v.numpy()) for k, v in hf.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in weights
    weights["model.layers.3.mlp.gate.weight"] = mx.zeros((4, 64))  # an MTP layer
    ours = deepseek_v3.Model(deepseek_v3.ModelArgs.from_dict(hf.config.to_dict()))
    ours.load_weights(list(ours.sanitize(weights).items()), strict=True)
    prompt = arch_harness.make_prompts((9,))[0]
    np.testing.assert_allclose(np.array(ours(mx.array([prompt]))[0]),
                               arch_harness.hf_logits(hf, prompt), atol=1e-4, rtol=1e-4)


def test_fp8_block_dequantization():
    import mlx.core as mx
    import numpy as np

    from mlx_lm_batched.models.deepseek_v2 import dequantize_fp8_blocks

    rng = np.random.default_rng(0)
    w = rng.normal(size=(200, 130)).astype(np.float32)  # ragged last blocks
    scale = rng.uniform(0.5, 2.0, size=(2, 2)).astype(np.float32)
    blocks = np.kron(scale, np.ones((128, 128), np.float32))[:200, :130]
    fp8 = torch.from_numpy(w / blocks).to(torch.float8_e4m3fn)
    expected = fp8.float().numpy() * blocks
    weights = {"x.weight": mx.array(fp8.view(torch.uint8).numpy()),
               "x.weight_scale_inv": mx.array(scale)}
    out = dequantize_fp8_blocks(weights)
    assert list(out) == ["x.weight"] and out["x.weight"].dtype == mx.bfloat16
    np.testing.assert_allclose(np.array(out["x.weight"].astype(mx.float32)), expected, rtol=1e-2)


@pytest.mark.parametrize("bits", [None, 8])
def test_mlx_lm_split_kv_b_proj_is_merged_back(bits):
    """Recent mlx-lm conversions store kv_b_proj split per head as embed_q /
    unembed_out (quantized or not); sanitize rebuilds kv_b_proj."""
    import mlx.core as mx
    import numpy as np

    from mlx_lm_batched.layers.mla import merge_absorbed_kv_b

    H, nope, v_dim, rank = 4, 32, 24, 64
    kv_b = mx.random.normal((H * (nope + v_dim), rank), key=mx.random.key(0))
    per_head = kv_b.reshape(H, nope + v_dim, rank)
    split = {"embed_q": per_head[:, :nope, :].swapaxes(-1, -2), "unembed_out": per_head[:, nope:, :]}
    weights, expected = {}, []
    for name, w in split.items():
        if bits:
            q, s, b = mx.quantize(w, group_size=32, bits=bits)
            weights.update({f"a.{name}.weight": q, f"a.{name}.scales": s, f"a.{name}.biases": b})
            w = mx.dequantize(q, s, b, group_size=32, bits=bits)
        else:
            weights[f"a.{name}.weight"] = w
        expected.append(w)
    merged = merge_absorbed_kv_b(weights, "a", nope, rank)
    assert list(merged) == ["a.kv_b_proj.weight"]
    want = mx.concatenate([expected[0].swapaxes(-1, -2), expected[1]], axis=1).reshape(-1, rank)
    np.testing.assert_array_equal(np.array(merged["a.kv_b_proj.weight"]), np.array(want))
    if not bits:
        np.testing.assert_array_equal(np.array(merged["a.kv_b_proj.weight"]), np.array(kv_b))
