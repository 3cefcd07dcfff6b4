"""Architectures of issue 19, part A (dense and small families): each against
transformers where it has the model, else mlx-lm 0.32 on the same tiny random
checkpoint (``tests/mlx_lm_oracle.py``), in both config layouts, with the harness's
four checks (padded logits, greedy rows, incremental decode, joining rows)."""

import pytest

from arch_harness import VOCAB, run_family

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
# mlx-lm's flat config (top-level RoPE keys) for families transformers lacks.
FLAT = dict(BASE, rope_theta=10000.0, rms_norm_eps=1e-6)
MLX_LM = {"oracle": "mlx_lm"}

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
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_wave3_family_matches_reference_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)
