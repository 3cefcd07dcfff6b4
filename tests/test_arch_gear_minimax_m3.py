"""Gear (Gemma 3 with gated key/value convolution layers) and MiniMax M3 (block-sparse
indexed attention), with mlx-lm 0.32 as the oracle (transformers 5.24 has no Gear; MiniMax M3
is also checked in transformers' layout against transformers): mlx-lm's module builds a tiny random model and saves it in its layout, our ``load``
reads it, and the harness's four checks (padded-batch logits, greedy rows equal solo,
incremental decode, rows joining a running ``BatchGenerator``) run against mlx-lm on
each prompt alone, in both config layouts."""

import mlx.core as mx
import pytest

from arch_harness import VOCAB, layout_cases, run_family

MLX_LM = {"oracle": "mlx_lm"}

# Gear: convolution, sliding (window 5: shorter than the prompts), convolution, global;
# 4 query heads share 2 key/value heads in the mixer as in attention.
GEAR = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            max_position_embeddings=256, rope_theta=10000.0, rope_local_base_freq=500.0,
            sliding_window=5, conv_L_cache=3, query_pre_attn_scalar=16,
            layer_types=["conv_mixer", "sliding_attention", "conv_mixer", "full_attention"])

# Biases, a 4-tap convolution, both soft-caps and an untied head.
GEAR_CAPPED = dict(GEAR, attention_bias=True, conv_L_cache=4, attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0, tie_word_embeddings=False)

# MiniMax M3 (language model of the VL checkpoint): layers 0 and 2 block-sparse
# (blocks of 2 keys, 2 kept per query, the query's own block always), layer 1 full;
# layers 0 and 2 MoE (4 experts, 2 per token, shared expert), layer 1 dense; 2 indexer
# heads, one per key/value group; RoPE on 8 of 16 features.
MINIMAX_M3_TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32,
                       dense_intermediate_size=96, shared_intermediate_size=32,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, rotary_dim=8, partial_rotary_factor=0.5,
                       num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-6,
                       max_position_embeddings=256, rope_theta=10000.0,
                       mlp_layer_types=["sparse", "dense", "sparse"],
                       layer_types=["minimax_m3_sparse", "full_attention", "minimax_m3_sparse"],
                       index_n_heads=2, index_head_dim=16, index_block_size=2,
                       index_topk_blocks=2, index_local_blocks=1)
MINIMAX_M3 = dict(text_config=MINIMAX_M3_TEXT, tie_word_embeddings=False)
# The same in transformers' layout (its model is the reference; a vision tower the
# loader drops): transformers' names (fused ``gate_up_proj``, ``self_attn.indexer``).
MINIMAX_M3_HF = dict(text_config=dict(MINIMAX_M3_TEXT, rope_parameters={
                         "rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5}),
                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, image_size=28, patch_size=14),
                     projector_hidden_size=32, tie_word_embeddings=False)

FAMILIES = {
    "gear": (GEAR, MLX_LM),
    "minimax_m3_vl": (MINIMAX_M3, MLX_LM),
    "minimax_m3_vl_hf": (MINIMAX_M3_HF, {"model_type": "minimax_m3_vl"}),
    "gear_capped": (GEAR_CAPPED, dict(MLX_LM, model_type="gear")),
}

# The variants check the extra math and transformers' names only: one layout (CI time).
CASES = layout_cases(FAMILIES, one_layout={"gear_capped", "minimax_m3_vl_hf"})


@pytest.mark.parametrize("name,layout", CASES)
def test_family_matches_mlx_lm_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def test_gear_mixer_shards_heads_and_convolution_channels():
    """Rank 0 of 2 keeps 2 of the 4 query heads, 1 of the 2 key/value heads and that
    head's 16 convolution channels (weights and biases) in the mixer layers."""
    from mlx_lm_batched.models import gear
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    model = gear.Model(gear.ModelArgs.from_dict(dict(GEAR_CAPPED, model_type="gear")))
    conv = model.layers[0].local_mixer.key_conv
    conv.weight = mx.arange(conv.weight.size, dtype=mx.float32).reshape(conv.weight.shape)
    before = conv.weight
    shard_model(model, TwoRanks())
    mixer = model.layers[0].local_mixer
    assert (mixer.n_heads, mixer.n_kv_heads) == (2, 1)
    assert mixer.q_proj.weight.shape == (32, 64) and mixer.k_proj.weight.shape == (16, 64)
    assert mixer.o_proj.weight.shape == (64, 32)
    assert mx.array_equal(mixer.key_conv.weight, before[:16])
    assert mixer.value_conv.weight.shape == (16, 1, 4) and mixer.value_conv.bias.shape == (16,)
    assert model.layers[1].self_attn.n_heads == 2  # attention: the shared split


def test_gear_refuses_bidirectional_attention():
    from mlx_lm_batched.models import gear

    with pytest.raises(NotImplementedError, match="use_bidirectional_attention"):
        gear.ModelArgs.from_dict(dict(GEAR, model_type="gear", use_bidirectional_attention=True))


def test_gear_reads_per_layer_type_rope_parameters():
    """transformers 5's per-layer-type ``rope_parameters`` (each type its own theta)
    build the same model as the flat keys of transformers 4."""
    import numpy as np

    from mlx_lm_batched.models import gear

    flat = dict(GEAR, model_type="gear")
    nested = {k: v for k, v in flat.items() if k not in ("rope_theta", "rope_local_base_freq")}
    nested["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}
    a = gear.Model(gear.ModelArgs.from_dict(flat))
    b = gear.Model(gear.ModelArgs.from_dict(nested))
    b.update(a.parameters())
    tokens = mx.array([[3, 17, 5, 9, 30, 2, 11, 8]])
    np.testing.assert_array_equal(np.array(a(tokens)), np.array(b(tokens)))
    swapped = dict(nested, rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 500.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    c = gear.Model(gear.ModelArgs.from_dict(swapped))
    c.update(a.parameters())
    assert not np.allclose(np.array(a(tokens)), np.array(c(tokens)))


def test_minimax_m3_shards_indexer_heads_with_their_groups():
    """Rank 0 of 2 keeps query heads 0-1, key/value head 0 and indexer head 0 (the
    group those query heads share); the indexer's one key head stays whole."""
    from mlx_lm_batched.models import minimax_m3_vl
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    args = minimax_m3_vl.ModelArgs.from_dict(dict(MINIMAX_M3, model_type="minimax_m3_vl"))
    model = minimax_m3_vl.Model(args)
    before = model.layers[0].self_attn.indexer.q_proj.weight
    shard_model(model, TwoRanks())
    attn = model.layers[0].self_attn
    assert (attn.n_heads, attn.n_kv_heads, attn.indexer.heads) == (2, 1, 1)
    assert mx.array_equal(attn.indexer.q_proj.weight, before[:16])
    assert attn.indexer.k_proj.weight.shape == (16, 64)


def test_minimax_m3_refuses_a_rotating_cache():
    from mlx_lm_batched.models import minimax_m3_vl

    args = minimax_m3_vl.ModelArgs.from_dict(dict(MINIMAX_M3, model_type="minimax_m3_vl"))
    with pytest.raises(ValueError, match="max_kv_size"):
        minimax_m3_vl.Model(args).make_cache(max_kv_size=64)
