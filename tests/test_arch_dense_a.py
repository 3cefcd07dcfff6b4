"""Dense families (group A) against transformers on tiny random configs, in both
config layouts, plus one 4-bit round trip through ``convert``."""

import tempfile
from pathlib import Path

import mlx.nn as nn
import numpy as np
import pytest

from arch_harness import (VOCAB, build_hf_model, run_family, greedy_tokens, make_prompts,
                          save_hf_model)
from mlx_lm_batched.convert import convert
from mlx_lm_batched.utils import load_model

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
# Windowed families: window 8, prompts and generations that cross it.
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}

# name -> (config kwargs, extra check options; "model_type" when name is a variant)
FAMILIES = {
    # Layer 0 global, layer 1 windowed (max_window_layers=1).
    "qwen2": (dict(BASE, use_sliding_window=True, sliding_window=8, max_window_layers=1),
              WINDOWED),
    "qwen3": (dict(BASE, head_dim=16, attention_bias=True, tie_word_embeddings=True), {}),
    "gemma": (dict(BASE, head_dim=16), {}),
    # Small soft-caps so the tanh actually bends the random logits.
    "gemma2": (dict(BASE, head_dim=16, sliding_window=8, query_pre_attn_scalar=12,
                    attn_logit_softcapping=2.0, final_logit_softcapping=3.0), WINDOWED),
    "starcoder2": (dict(BASE, sliding_window=8, tie_word_embeddings=False), WINDOWED),
    "granite": (dict(BASE, embedding_multiplier=3.0, attention_multiplier=0.2,
                     residual_multiplier=0.5, logits_scaling=4.0, attention_bias=True), {}),
    "helium": (dict(BASE, head_dim=16, attention_bias=True, mlp_bias=True), {}),
    "olmo2": (dict(BASE), {}),
    # clip_qkv low enough that the clamps act on std-0.3 projections.
    "olmo": (dict(BASE, clip_qkv=1.5, tie_word_embeddings=False), {}),
    "ministral3": (dict(BASE, head_dim=16, sliding_window=8, max_position_embeddings=64,
                        rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5}), WINDOWED),
    # mlx-lm as the oracle (transformers has no MiMo); flat (mlx-lm) config keys.
    "mimo": (dict(BASE, rms_norm_eps=1e-6, rope_theta=10000.0, num_nextn_predict_layers=1),
             {"oracle": "mlx_lm"}),
    # mlx-lm as the oracle: grouped wqkv rows (2 query heads per kv head), biases.
    "internlm2": (dict(BASE, rms_norm_eps=1e-6, bias=True), {"oracle": "mlx_lm"}),
    "minicpm": (dict(BASE, rms_norm_eps=1e-6, rope_theta=5000.0, scale_emb=2.0, scale_depth=1.4, dim_model_base=16,
                     tie_word_embeddings=False), {"oracle": "mlx_lm"}),
    # GPT-2-style weight names in the saved checkpoint.
    "exaone": (dict(BASE, head_dim=16, eos_token_id=2), {}),
    "qwen": (dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                  intermediate_size=192, kv_channels=16, no_bias=True), {"oracle": "mlx_lm"}),
    "internlm3": (dict(BASE, head_dim=16, qkv_bias=True, bias=True), {}),
    # YaRN on the global layer only; layer types: sliding, sliding, full.
    "olmo3": (dict(BASE, num_hidden_layers=3, sliding_window=8,
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
                                    "full_attention": {"rope_type": "yarn", "factor": 4.0,
                                                       "rope_theta": 5000.0,
                                                       "original_max_position_embeddings": 64}}),
              WINDOWED),
    # Layers 0 and 2 rotate, layer 1 has no positional encoding; layer 2 slides.
    "smollm3": (dict(BASE, num_hidden_layers=3, no_rope_layers=[1, 0, 1], use_sliding_window=True,
                     sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     layer_types=["full_attention", "full_attention", "sliding_attention"]),
                WINDOWED),
    "seed_oss": (dict(BASE, head_dim=16, attention_bias=True, attention_out_bias=True,
                      mlp_bias=True), {}),
    "ernie4_5": (dict(BASE, head_dim=16, use_bias=True), {}),
    # Pattern "LLG": two windowed RoPE layers, then a global layer without RoPE.
    "exaone4": (dict(BASE, num_hidden_layers=3, head_dim=16, sliding_window=8,
                     sliding_window_pattern="LLG",
                     layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
                WINDOWED),
    "glm4": (dict(BASE, head_dim=16, partial_rotary_factor=0.5, pad_token_id=0,
                  eos_token_id=[1, 2]), {}),
    "apertus": (dict(BASE, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0,
                                            "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 32}), {}),
    # "dynamic" RoPE with a fixed NTK alpha (a stretched base).
    "hunyuan_v1_dense": (dict(BASE, head_dim=16, attention_bias=True,
                              rope_parameters={"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0,
                                               "rope_theta": 10000.0}), {}),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def test_quantized_gemma2_batches_exactly():
    """4-bit conversion of a windowed, soft-capped, tied-embedding family: padded
    rows generate exactly what each prompt generates alone (quantized logits are
    not comparable with transformers, so row equality is the bar)."""
    config, options = FAMILIES["gemma2"]
    hf = build_hf_model("gemma2", config)
    with tempfile.TemporaryDirectory() as d:
        save_hf_model(hf, Path(d) / "hf", "transformers5")
        convert(Path(d) / "hf", Path(d) / "q4", quantize=True, q_group_size=32, q_bits=4)
        model, cfg = load_model(Path(d) / "q4")
    assert cfg["quantization"] == {"group_size": 32, "bits": 4, "mode": "affine"}
    layer = model.layers[0]
    assert isinstance(layer.self_attn.q_proj, nn.QuantizedLinear)
    assert isinstance(layer.mlp.down_proj, nn.QuantizedLinear)
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)

    prompts = make_prompts(options["lengths"], seed=3)
    batch = greedy_tokens(model, prompts, 16)
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(batch[i], greedy_tokens(model, [p], 16)[0],
                                      err_msg=f"quantized gemma2 row {i}")
