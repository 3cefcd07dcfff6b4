"""Every registered family against transformers on tiny random configs, in both
config layouts (transformers 4 top-level rope keys, transformers 5 rope_parameters)."""

import pytest

from arch_harness import VOCAB, run_family

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

# model_type -> (config kwargs, extra check options). Windowed families use a
# window of 8 and prompts long enough to cross it.
FAMILIES = {
    "llama": (dict(BASE, tie_word_embeddings=False), {}),
    # mlx-lm's alias: IQuest-Coder checkpoints are llama ones under another name.
    "iquestcoder": (BASE, {"model_type": "llama", "saved_model_type": "iquestcoder"}),
    "llama-llama3-rope": (
        dict(BASE, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
        {"model_type": "llama"},
    ),
    "llama-linear-rope": (
        dict(BASE, rope_scaling={"rope_type": "linear", "factor": 2.0}), {"model_type": "llama"}
    ),
    "mistral": (dict(BASE, sliding_window=8, head_dim=16),
                {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}),
    "gemma3_text": (
        dict(BASE, num_hidden_layers=3, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
             layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
        {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)},
    ),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)
