"""Architectures, wave 3 (part f): DeepSeek V4.1 (``deepseek_v41`` and its
``deepseek_v41_text`` alias), checked against mlx-lm 0.32's module on the same tiny
random checkpoint (transformers 5.24 has no DeepSeek V4.1)."""

import mlx.core as mx
import numpy as np
import pytest
from arch_harness import VOCAB, make_prompts, run_family
from mlx_lm_oracle import build_mlx_lm_model

from mlx_lm_batched.models.deepseek_v41 import Model, ModelArgs

# Four layers: window only; a 2-to-1 compressor that also makes index keys and picks
# the candidate blocks (2 blocks of 2 keys); an indexer reusing those keys within the
# candidates; a layer reusing the previous top-k. A window of 4 slots and a top-k of 3
# groups make prompts of 12 tokens exercise eviction, group closing and selection.
DEEPSEEK_V41 = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    head_dim=32, q_lora_rank=32, qk_rope_head_dim=8, o_groups=2, o_lora_rank=16,
    moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
    routed_scaling_factor=1.5, swiglu_limit=10.0, rms_norm_eps=1e-6, sliding_window=4,
    compress_ratios=[0, 2, 2, 2], kv_source_layer_ids=[1], index_source_layer_ids=[1, 2],
    candidate_source_layer_id=1, candidate_topk_blocks=2, candidate_block_size=2,
    index_n_heads=2, index_head_dim=32, index_topk=3, rope_theta=10000.0,
    compress_rope_theta=40000.0, max_position_embeddings=256, hc_mult=2,
    hc_sinkhorn_iters=4, tie_word_embeddings=False,
)
MLX_LM = {"oracle": "mlx_lm", "std": 0.3}

FAMILIES = {
    "deepseek_v41": (DEEPSEEK_V41, MLX_LM),
    "deepseek_v41_text": (DEEPSEEK_V41, dict(MLX_LM, model_type="deepseek_v41",
                                             saved_model_type="deepseek_v41_text")),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_mlx_lm_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)
