"""Tensor parallelism over 2 local ranks (``mlx.launch --backend ring -n 2``) on tiny
random checkpoints against the single-process model: DeepSeek V3 (MLA + MoE experts +
shared experts) and Qwen 2 MoE (GQA with 3 KV heads, experts, shared expert), and every
recurrent and hybrid family whose state the ranks split. All of them run in one launch of
``tests/dist_worker.py`` per rank; rank 0 compares and writes a JSON result per model."""

import json
import math

import pytest

import arch_harness
import mlx_lm_oracle
from distributed_harness import TIMEOUT, assert_tensor_parallel_result, launch, tiny_tokenizer
from test_arch_minicpm3_minimax import MINIMAX
from test_arch_mlxlm_oracle import BAICHUAN_M1, normalised_head
from test_arch_recurrent import (FALCON_H1, GRANITE_HYBRID, JAMBA, KIMI_LINEAR, LFM2, MAMBA,
                                 NEMOTRON_H, QWEN3_5, QWEN3_NEXT, RECURRENT_GEMMA)
from test_arch_muse_spark_kimi_k3 import KIMI_K3

# Each test launches 2 ranks: left out of the quick run (-m "not slow").
pytestmark = pytest.mark.slow

TINY = {
    "deepseek_v3": (dict(vocab_size=arch_harness.VOCAB, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3,
                         max_position_embeddings=256, kv_lora_rank=16, q_lora_rank=24,
                         qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                         moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                         n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1),
                    [2, 3]),
    "qwen2_moe": (dict(vocab_size=arch_harness.VOCAB, hidden_size=48, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
                       max_position_embeddings=256, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=48),
                  [4, 6]),
}


# Tiny recurrent and hybrid checkpoints (configs of tests/test_arch_recurrent.py and
# test_arch_minicpm3_minimax.py), some reshaped so 2 ranks split them unevenly or share a
# group: name -> (model_type, config, rank 0's state-cache shapes after a prefill of 2 rows
# (None: only "smaller than whole")).
RECURRENT = {
    # 6 heads in 3 B/C groups: rank 0 gets 2 whole groups (4 heads), rank 1 one.
    "mamba2": ("mamba2", dict(MAMBA, hidden_size=48, num_heads=6, head_dim=16, n_groups=3),
               [[2, 3, 96], [2, 4, 16, 8]] * 2),  # conv: 4*16 x + 2*8 B + 2*8 C channels
    # Gated delta (fused projections) + gated attention + MoE with a shared expert; one
    # key head (replicated on both ranks), its 3 value heads split 2 / 1.
    "qwen3_next": ("qwen3_next", dict(QWEN3_NEXT, linear_num_key_heads=1,
                                      linear_num_value_heads=3), [[2, 3, 32], [2, 2, 8, 8]] * 2),
    # Separate projections; 2 key heads with 2 value heads each: one key head per rank.
    "qwen3_5": ("qwen3_5_text", QWEN3_5, [[2, 3, 32], [2, 2, 8, 8]] * 2),
    "lfm2": ("lfm2", LFM2, [[2, 2, 32]] * 2),  # short conv by channels
    # Mamba-2, attention, ReLU² MLP and latent MoE blocks (latent projections whole).
    "nemotron_h": ("nemotron_h", dict(NEMOTRON_H, moe_latent_size=32), [[2, 3, 48], [2, 4, 8, 8]]),
    "minimax": ("minimax", MINIMAX, [[2, 2, 16, 16]] * 2),  # lightning: 4 heads split 2 / 2
    # One B/C group of 8 heads: split 4 / 4, the gated norm sums over the ranks.
    "granitemoehybrid": ("granitemoehybrid", dict(GRANITE_HYBRID, mamba_n_groups=1), None),
    "falcon_h1": ("falcon_h1", dict(FALCON_H1, mamba_rms_norm=True), None),
    "mamba": ("mamba", MAMBA, [[2, 3, 64], [2, 64, 8]] * 2),  # Mamba 1: by channels
    "kimi_linear": ("kimi_linear", KIMI_LINEAR, None),
    "recurrent_gemma": ("recurrent_gemma", RECURRENT_GEMMA, None),
    "jamba": ("jamba", JAMBA, None),
    # 4-bit conversions (groups of 32): every projection splits on whole groups.
    "mamba2-q4": ("mamba2", dict(MAMBA, num_heads=8, head_dim=16, n_groups=2), None),
    "lfm2-q4": ("lfm2", LFM2, [[2, 2, 32]] * 2),
    # Key/value convolution per KV head (mlx-lm's module as the builder): 2 KV heads on
    # every layer, one per rank, with its taps.
    "baichuan_m1": ("baichuan_m1", dict(BAICHUAN_M1, num_swa_attention_heads=4,
                                        num_swa_key_value_heads=2), [[2, 1, 16]] * 6),
    # KDA (full-rank gates) by heads, latent attention with per-feature gates, attention
    # residuals and a latent MoE (mlx-lm's module as the builder): 4 heads split 2 / 2.
    "kimi_k3": ("kimi_k3", KIMI_K3, [[2, 3, 96], [2, 2, 16, 16]] * 3),
}
# Families transformers has no model for: mlx-lm's module builds and saves the checkpoint.
MLX_LM_BUILT = {"baichuan_m1": normalised_head, "kimi_k3": lambda model: None}


def build_recurrent_models(root):
    """Every ``RECURRENT`` checkpoint under ``root / "models"`` (4-bit ones converted from
    float ones built beside it); returns that directory."""
    from mlx_lm_batched import convert

    models = root / "models"
    for name, (model_type, config, _) in RECURRENT.items():
        directory = root / name if name.endswith("-q4") else models / name
        if model_type in MLX_LM_BUILT:
            ref = mlx_lm_oracle.build_mlx_lm_model(model_type, config)
            MLX_LM_BUILT[model_type](ref)
            directory.mkdir(parents=True)
            mlx_lm_oracle.save_mlx_lm_model(ref, dict(config, model_type=model_type), directory,
                                            "transformers5")
        else:
            arch_harness.save_hf_model(arch_harness.build_hf_model(model_type, config),
                                       directory, "transformers5")
        tiny_tokenizer(directory)
        if name.endswith("-q4"):
            convert(str(directory), str(models / name), quantize=True, q_group_size=32, q_bits=4)
    return models


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every check of this file in one 2-rank launch (``dist_worker.py plan``): each rank
    imports the package and joins the ring once. ``(results by plan name, output)``."""
    root = tmp_path_factory.mktemp("tiny")
    plan = []
    for model_type, (config, _) in sorted(TINY.items()):
        directory = root / model_type
        arch_harness.save_hf_model(arch_harness.build_hf_model(model_type, config), directory,
                                   "transformers5")
        tiny_tokenizer(directory)
        plan.append([model_type, "tensor", str(directory)])
    plan.append(["recurrent and hybrid", "many", str(build_recurrent_models(root))])
    (root / "plan.json").write_text(json.dumps(plan))
    data, out, _ = launch("plan", root / "plan.json", timeout=len(plan) * TIMEOUT)
    assert data is not None, out[-3000:]
    assert sorted(data) == sorted(name for name, _, _ in plan)
    return data, out


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_tensor_parallel_tiny_moe_and_mla(model_type, launched):
    data, out = launched
    assert_tensor_parallel_result(data[model_type], out, TINY[model_type][1])


def test_tensor_parallel_recurrent_and_hybrid_models(launched):
    """Every family in one check: padded logits, greedy tokens and rows joining a running
    BatchGenerator equal one process; each rank's state caches hold its heads."""
    data = launched[0]["recurrent and hybrid"]
    assert data["size"] == 2 and sorted(data["models"]) == sorted(RECURRENT)
    for name, (_, _, shapes) in RECURRENT.items():
        entry = data["models"][name]
        assert "failure" not in entry, f"{name}: {entry['failure']}"
        assert entry["passed"] == ["padded logits", "greedy tokens", "rows joining BatchGenerator"]
        sharded, whole = entry["states"]
        assert len(sharded) == len(whole) > 0, name
        for a, b in zip(sharded, whole):  # same kinds of arrays, this rank's part of each
            assert len(a) == len(b) and a[0] == b[0] and 0 < math.prod(a) < math.prod(b), name
        if shapes is not None:
            assert sharded == shapes, name
