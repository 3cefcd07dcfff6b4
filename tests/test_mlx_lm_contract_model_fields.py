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


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_phimoe_sparsemixer_matches_mlx_lm(top_k):
    import mlx.core as mx

    theirs = importlib.import_module("mlx_lm.models.phimoe").sparsemixer
    ours = importlib.import_module("mlx_lm_batched.models.phimoe").sparsemixer
    mx.random.seed(3)
    # Random router logits, plus rows with near ties (the shared-weight band) and negatives.
    gates = mx.concatenate([mx.random.normal((6, 5)),
                            mx.array([[2.0, 1.995, 0.5, -1.0, -3.0], [-0.5, -0.501, -2.0, 1.0, 1.0]])])
    (i1, w1), (i2, w2) = ours(gates, top_k=top_k, jitter_eps=0.01), theirs(
        gates, top_k=top_k, jitter_eps=0.01)
    assert i1.tolist() == i2.tolist()
    assert mx.allclose(w1, w2, atol=1e-6).item()
    grads = [mx.grad(lambda g, f=f: f(g, top_k=top_k, jitter_eps=0.01)[1].sum())(gates)
             for f in (ours, theirs)]
    assert mx.allclose(grads[0], grads[1], atol=1e-6).item()
