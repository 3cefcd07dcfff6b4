"""Wave 3 of the architectures, part C (recurrent and hybrid families), with mlx-lm
0.32 as the oracle where transformers 5.24 has no model: mlx-lm's module builds a tiny
random model and saves it in its layout, our ``load`` reads it, and the harness's four
checks (padded-batch logits, greedy rows equal solo, incremental decode, rows joining a
running ``BatchGenerator``) run against mlx-lm on each prompt alone, in both config
layouts."""

import mlx.core as mx
import pytest

from arch_harness import VOCAB, run_family
from test_arch_mlxlm_oracle import positive_expert_bias

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rope_theta=10000.0, rms_norm_eps=1e-6)
MLX_LM = {"oracle": "mlx_lm"}

# Ling-linear: layers 0 and 1 linear (lightning) attention, layer 2 softmax; a sigmoid
# router with an expert bias over 2 groups, QK-norm, half the head rotated, the output
# norm in 2 groups, layer 0 dense.
BAILING_LINEAR = dict(BASE, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      num_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True,
                      score_function="sigmoid", moe_router_enable_expert_bias=True, n_group=2,
                      topk_group=1, routed_scaling_factor=2.0, use_qk_norm=True,
                      partial_rotary_factor=0.5, layer_group_size=3, group_norm_size=2)

FAMILIES = {
    "bailing_moe_linear": (BAILING_LINEAR, dict(MLX_LM, hf_hook=positive_expert_bias)),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_mlx_lm_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


@pytest.mark.parametrize("groups", [2, 1])
def test_bailing_linear_shards_heads_decays_and_norm_groups(groups):
    """Rank 0 of 2 keeps 2 of the 4 linear-attention heads with their decays, the gate's
    matching rows and its norm groups: whole groups (2 groups), or its part of the one
    group with the sum of squares all-reduced. (Two real ranks matched one process when
    run, in 80 s: too slow for CI.)"""
    from mlx_lm_batched.models import bailing_moe_linear
    from mlx_lm_batched.parallel.recurrent import ShardedGatedRMSNorm
    from mlx_lm_batched.parallel.shard import shard_model
    from test_distributed import _TwoRanks

    args = bailing_moe_linear.ModelArgs.from_dict(
        dict(BAILING_LINEAR, group_norm_size=groups, model_type="bailing_moe_linear"))
    model = bailing_moe_linear.Model(args)
    slopes = model.layers[0].self_attn._slope
    shard_model(model, _TwoRanks())
    attn = model.layers[0].self_attn
    assert attn.n_heads == attn.n_kv_heads == 2
    assert attn.qkv_proj.weight.shape == (3 * 2 * 16, 64)
    assert attn.g_proj.weight.shape == (32, 64)
    assert mx.array_equal(attn._slope, slopes[:2])
    assert attn.g_norm.weight.shape == (32,)
    assert isinstance(attn.g_norm, ShardedGatedRMSNorm) == (groups == 1)
    assert attn.g_norm.groups == 1
    assert model.layers[2].self_attn.n_heads == 2  # softmax attention: the shared split
