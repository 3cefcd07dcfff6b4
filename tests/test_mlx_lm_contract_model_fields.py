"""ModelArgs fields that code written for mlx-lm reads, derived as mlx-lm 0.32 derives
them: Nemotron-H's ``hybrid_override_pattern`` and layer count from ``layers_block_type``
(also its older spellings), LFM2's ``block_ff_dim`` from ``intermediate_size``."""

import importlib

import pytest

NEMOTRON = {"model_type": "nemotron_h", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
            "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 8, "conv_kernel": 3,
            "n_groups": 2, "layer_norm_epsilon": 1e-5, "max_position_embeddings": 64,
            "attention_bias": False, "mamba_proj_bias": False, "mlp_bias": False,
            "use_bias": False, "use_conv_bias": True}


@pytest.mark.parametrize("blocks", [
    {"layers_block_type": ["full_attention", "linear_attention", "mlp", "moe", "mlp"]},
    {"layers_block_type": ["attention", "conv", "mlp"]},
    {"layers_block_type": ["mamba", "mamba", "attention", "moe"]},
    {"hybrid_override_pattern": "M*-EM"},
])
def test_nemotron_h_pattern_and_layer_count_match_mlx_lm(blocks):
    theirs = importlib.import_module("mlx_lm.models.nemotron_h").ModelArgs.from_dict(
        dict(NEMOTRON, **blocks))
    ours = importlib.import_module("mlx_lm_batched.models.nemotron_h").ModelArgs.from_dict(
        dict(NEMOTRON, **blocks))
    assert list(ours.hybrid_override_pattern) == list(theirs.hybrid_override_pattern)
    assert ours.num_hidden_layers == theirs.num_hidden_layers


def test_nemotron_h_unknown_block_type_is_one_line():
    from mlx_lm_batched.models import nemotron_h

    with pytest.raises(ValueError, match="unknown layers_block_type sliding_attention"):
        nemotron_h.ModelArgs.from_dict(dict(NEMOTRON, layers_block_type=["sliding_attention"]))


def test_lfm2_block_ff_dim_from_intermediate_size_matches_mlx_lm():
    config = {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "norm_eps": 1e-5,
              "vocab_size": 100, "full_attn_idxs": [1], "rope_theta": 10000.0,
              "block_dim": 64, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 32,
              "block_auto_adjust_ff_dim": False, "intermediate_size": 96,
              "max_position_embeddings": 128, "conv_bias": False, "conv_L_cache": 3}
    theirs = importlib.import_module("mlx_lm.models.lfm2").ModelArgs.from_dict(config)
    ours = importlib.import_module("mlx_lm_batched.models.lfm2").ModelArgs.from_dict(config)
    assert ours.block_ff_dim == theirs.block_ff_dim == 96
