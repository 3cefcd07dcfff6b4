"""MiniCPM3 (latent attention with MiniCPM's scalings) and MiniMax (softmax attention
mixed with lightning attention, MoE) against transformers on tiny random configs."""

import pytest

from arch_harness import VOCAB, run_family
from test_arch_deepseek import sharpen

MINICPM3 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
                scale_emb=2.5, scale_depth=1.4, dim_model_base=16)

FAMILIES = {
    # Sharpened attention: DeepSeek's interleaved rotation would miss the tolerance.
    "minicpm3": (dict(MINICPM3, tie_word_embeddings=False, v_head_dim=12), {"hf_hook": sharpen}),
    # Full-rank queries, tied head, transformers' no-op defaults for the scalings.
    "minicpm3-tied-no-q-lora": (dict(MINICPM3, q_lora_rank=None, scale_depth=None,
                                     dim_model_base=None, rope_parameters={
                                         "rope_type": "linear", "factor": 2.0,
                                         "rope_theta": 5000.0}),
                                {"model_type": "minicpm3", "hf_hook": sharpen}),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)
