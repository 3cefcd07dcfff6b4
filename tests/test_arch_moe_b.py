"""Mixture-of-experts families, group B (GLM-4.5's MoE under Llama attention, Phixtral,
Mellum's per-layer sparse and dense blocks, Klear's mixed routed and shared experts):
each against transformers where it has the model, else mlx-lm 0.32 on the same tiny
random checkpoint (``tests/mlx_lm_oracle.py``), in both config layouts, with the
harness's four checks; and Klear's tensor-parallel split."""

import pytest

from arch_harness import VOCAB, run_family

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
# mlx-lm's flat config (top-level RoPE keys) for families transformers lacks.
FLAT = dict(BASE, rope_theta=10000.0, rms_norm_eps=1e-6)
MLX_LM = {"oracle": "mlx_lm"}
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}

FAMILIES = {
    # GLM-4.5's MoE with Llama attention, every layer MoE.
    "solar_open": (dict(BASE, head_dim=16, moe_intermediate_size=32, n_routed_experts=4,
                        num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=1.5),
                   {}),
    # A remapped name: phi-msft is Phixtral (mlx-lm's Phixtral as the oracle).
    "phi-msft": (dict(num_vocab=VOCAB, model_dim=64, num_heads=4, num_layers=2, rotary_dim=8,
                      num_local_experts=4, num_experts_per_tok=2),
                 dict(MLX_LM, model_type="phixtral", saved_model_type="phi-msft")),
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
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_reference_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def test_tensor_parallel_splits_klear():
    """Klear's blocks are the shared ones (its ``coefficient`` mixer stays whole on
    every rank)."""
    from mlx_lm_batched.models import get_model_module
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    klear = get_model_module("Klear")
    config = dict(FAMILIES["Klear"][0], model_type="Klear")
    model = shard_model(klear.Model(klear.ModelArgs.from_dict(config)), TwoRanks())
    moe = model.layers[0].mlp
    assert moe.coefficient.weight.shape == (2, 64)
    assert moe.switch_mlp.gate_proj.weight.shape == (4, 16, 64)
    assert moe.shared_experts.down_proj.weight.shape == (64, 32)
    assert model.layers[0].self_attn.q_proj.weight.shape == (32, 64)
