"""Mixture-of-experts families against transformers on tiny random configs (4 experts,
top-2), in both config layouts, plus one 4-bit converted checkpoint that must batch
exactly (gather_qmm)."""

import pytest

from arch_harness import VOCAB, run_family

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}

FAMILIES = {
    "mixtral": (dict(BASE, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=8, tie_word_embeddings=False), WINDOWED),
    "qwen2_moe": (dict(BASE, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=48,
                       mlp_only_layers=[1], use_sliding_window=True, sliding_window=8,
                       max_window_layers=2), WINDOWED),
    "qwen3_moe": (dict(BASE, head_dim=16, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                       use_sliding_window=True, sliding_window=8), WINDOWED),
    "phimoe": (dict(BASE, intermediate_size=32, num_local_experts=4, attention_bias=True,
                    lm_head_bias=True, sliding_window=8,
                    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                     "short_factor": [1.0, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, 4.0],
                                     "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 9.0],
                                     "short_mscale": 1.2, "long_mscale": 1.2,
                                     "original_max_position_embeddings": 64}), WINDOWED),
    "olmoe": (dict(BASE, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                   clip_qkv=1.5), {}),
    # mlx-lm as the oracle (no transformers model); its own config names.
    "phixtral": (dict(num_vocab=VOCAB, model_dim=64, num_heads=4, num_layers=2, rotary_dim=8,
                      num_local_experts=4, num_experts_per_tok=2), {"oracle": "mlx_lm"}),
    # mlx-lm as the oracle (no transformers model): layer 0 dense, 1 and 2 MoE.
    "deepseek": (dict(BASE, num_hidden_layers=3, moe_intermediate_size=32, n_routed_experts=4,
                      num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                      rope_theta=10000.0), {"oracle": "mlx_lm"}),
    # Per-layer top-k; NTK-alpha RoPE as in the dense family.
    "hunyuan_v1_moe": (dict(BASE, head_dim=16, intermediate_size=32, num_experts=4,
                            moe_topk=[2, 1], rope_parameters={
                                "rope_type": "dynamic", "alpha": 50.0, "factor": 1.0,
                                "rope_theta": 10000.0}), {}),
    # Half the head rotated; the correction bias is randomised by the harness.
    "minimax_m2": (dict(BASE, head_dim=16, intermediate_size=32, num_local_experts=4,
                        num_experts_per_tok=2, partial_rotary_factor=0.5), {}),
    # Nested configs; L2-normalised router weights, clamped qkv.
    "dbrx": (dict(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2, max_seq_len=256,
                  attn_config=dict(clip_qkv=1.5, kv_n_heads=2, rope_theta=10000.0),
                  ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2,
                                  moe_normalize_expert_weights=2.0)), {}),
    "granitemoe": (dict(BASE, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                        embedding_multiplier=1.5, residual_multiplier=0.7,
                        attention_multiplier=0.2, logits_scaling=2.0, attention_bias=True,
                        tie_word_embeddings=False), {}),
    "ernie4_5_moe": (dict(BASE, num_hidden_layers=3, moe_num_experts=4, moe_k=2,
                          moe_intermediate_size=32, moe_num_shared_experts=1,
                          moe_layer_start_index=1, moe_layer_end_index=2, use_bias=True), {}),
    "glm4_moe": (dict(BASE, num_hidden_layers=3, head_dim=32, n_routed_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                      first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=1.5,
                      attention_bias=True, use_qk_norm=True), {}),
    "dots1": (dict(BASE, num_hidden_layers=3, n_routed_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                   n_group=2, topk_group=1, norm_topk_prob=True, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
              WINDOWED),
    "gpt_oss": (dict(BASE, num_hidden_layers=3, head_dim=16, intermediate_size=32,
                     num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                     swiglu_limit=0.5), WINDOWED),  # low limit: the clamps act
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_moe_family_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def test_moe_4bit_conversion_batches_exactly(tmp_path):
    """A 4-bit converted GPT-OSS (quantized switch layers with biases) generates the
    same greedy tokens for each padded row as for that prompt alone, and its padded
    logits match the solo ones: gather_qmm is evaluated per token, sorted or not."""
    import mlx.core as mx
    import numpy as np

    from arch_harness import build_hf_model, greedy_tokens, make_prompts, save_hf_model
    from mlx_lm_batched.engine.prefill_plan import left_pad
    from mlx_lm_batched.convert import convert
    from mlx_lm_batched.layers.moe import QuantizedSwitchLinear, SwitchLinear
    from mlx_lm_batched.utils import load_model

    config, _ = FAMILIES["gpt_oss"]
    save_hf_model(build_hf_model("gpt_oss", config), tmp_path / "hf", "transformers5")
    convert(tmp_path / "hf", tmp_path / "q4", quantize=True, q_group_size=32, q_bits=4)
    model, cfg = load_model(tmp_path / "q4")
    assert cfg["quantization"]["bits"] == 4
    experts = model.layers[0].mlp.experts
    assert all(isinstance(experts[n], QuantizedSwitchLinear)
               for n in ("gate_proj", "up_proj", "down_proj"))

    # Long prompts so the batched prefill takes the sorted gather path, short ones not.
    prompts = make_prompts((5, 30, 1, 17), seed=3)
    tokens, padding = left_pad(prompts)
    logits = model(tokens, offset=mx.array([-p for p in padding]))
    for i, p in enumerate(prompts):
        solo = model(mx.array([p]))[0]
        np.testing.assert_allclose(np.array(logits[i, padding[i]:]), np.array(solo),
                                   atol=1e-4, rtol=1e-4, err_msg=f"row {i} logits")
    batch = greedy_tokens(model, prompts, 16)
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(batch[i], greedy_tokens(model, [p], 16)[0],
                                      err_msg=f"row {i}")

    # Dequantizing turns the switch layers back into float ones with the same outputs.
    convert(tmp_path / "q4", tmp_path / "deq", dequantize=True)
    float_model, _ = load_model(tmp_path / "deq")
    assert isinstance(float_model.layers[0].mlp.experts.down_proj, SwitchLinear)
    np.testing.assert_allclose(np.array(float_model(tokens, offset=mx.array([-p for p in padding]))),
                               np.array(logits), atol=1e-4, rtol=1e-4)


def test_gpt_oss_mxfp4_checkpoint_matches_transformers(tmp_path):
    """The original GPT-OSS release stores experts as MXFP4 ``*_blocks``/``*_scales``.
    Build such a checkpoint from a tiny model (MLX's mxfp4 packing is checked against
    transformers' own dequantizer), load it quantized, and compare with transformers
    running the dequantized experts."""
    import json

    import mlx.core as mx
    import numpy as np
    import torch
    from transformers.integrations.mxfp4 import _convert_moe_packed_tensors

    from arch_harness import build_hf_model, hf_logits, make_prompts
    from mlx_lm_batched.engine.prefill_plan import left_pad
    from mlx_lm_batched.layers.moe import QuantizedSwitchLinear
    from mlx_lm_batched.utils import load_model

    config, _ = FAMILIES["gpt_oss"]
    hf = build_hf_model("gpt_oss", config)
    hf.save_pretrained(tmp_path)
    weights = mx.load(str(tmp_path / "model.safetensors"))
    params = dict(hf.named_parameters())
    for name in [k for k in weights if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        rows = weights.pop(name).swapaxes(1, 2)  # (E, out, in): the blocks' layout
        wq, scales = mx.quantize(rows, 32, 4, mode="mxfp4")
        blocks = wq.view(mx.uint8).reshape(*rows.shape[:2], -1, 16)
        weights[name + "_blocks"], weights[name + "_scales"] = blocks, scales
        deq = _convert_moe_packed_tensors(torch.from_numpy(np.array(blocks)),
                                          torch.from_numpy(np.array(scales)), dtype=torch.float32)
        ours = mx.dequantize(wq, scales, None, 32, 4, mode="mxfp4").astype(mx.float32)
        np.testing.assert_array_equal(deq.numpy(), np.array(ours.swapaxes(1, 2)))
        with torch.no_grad():
            params[name].copy_(deq)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))

    model, _ = load_model(tmp_path)
    assert isinstance(model.layers[1].mlp.experts.down_proj, QuantizedSwitchLinear)
    prompts = make_prompts((9, 3, 14))
    tokens, padding = left_pad(prompts)
    logits = model(tokens, offset=mx.array([-p for p in padding]))
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(np.array(logits[i, padding[i]:]), hf_logits(hf, p),
                                   atol=1e-4, rtol=1e-4, err_msg=f"row {i}")


@pytest.mark.parametrize("kind", ["glu", "mlp"])
def test_switch_layers_match_per_expert_reference(kind):
    """Switch layers equal a per-token, per-expert loop, on the unsorted (few tokens)
    and sorted (many tokens) gather paths, in float and 4-bit."""
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np

    from mlx_lm_batched.layers.moe import SORT_THRESHOLD, SwitchGLU, SwitchMLP

    mx.random.seed(0)
    E, D, H, k = 4, 64, 32, 2
    layer = (SwitchGLU(D, H, E, bias=True) if kind == "glu" else SwitchMLP(D, H, E, bias=True))
    for name, child in layer.children().items():
        if isinstance(child, nn.Module):
            child.bias = mx.random.normal(child.bias.shape)

    def reference(x, idx):
        dense = lambda lin, e, v: v @ lin.weight[e].T + lin.bias[e]
        out = np.zeros(idx.shape + (D,), np.float32)
        for pos in np.ndindex(*idx.shape):
            e, v = int(idx[pos]), x[pos[:-1]]
            if kind == "glu":
                h = nn.silu(dense(layer.gate_proj, e, v)) * dense(layer.up_proj, e, v)
                out[pos] = np.array(dense(layer.down_proj, e, h))
            else:
                out[pos] = np.array(dense(layer.fc2, e, nn.gelu(dense(layer.fc1, e, v))))
        return out

    cases = [(2, 3), (3, SORT_THRESHOLD // 2)]  # (rows, tokens): unsorted, then sorted
    inputs = [(mx.random.normal((b, t, D)), mx.random.randint(0, E, (b, t, k))) for b, t in cases]
    floats = []
    for x, idx in inputs:
        y = layer(x, idx)
        assert y.shape == idx.shape + (D,)
        np.testing.assert_allclose(np.array(y), reference(x, idx), atol=1e-4, rtol=1e-4)
        floats.append(y)
    nn.quantize(layer, group_size=32, bits=4)
    for (x, idx), y in zip(inputs, floats):
        yq = layer(x, idx)  # close to float; each row alone gives the same numbers
        assert float(mx.abs(yq - y).max()) < 0.5 * float(mx.abs(y).max())
        np.testing.assert_array_equal(np.array(layer(x[1:2], idx[1:2])), np.array(yq[1:2]))
