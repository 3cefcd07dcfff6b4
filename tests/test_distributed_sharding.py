"""Sharding and pipeline stages in one process (no launch): which heads, groups and
layers each rank keeps, and the layers and splits refused with their name."""

import pytest

from distributed_harness import TwoRanks


def test_head_ranges_cover_every_query_head_once():
    from mlx_lm_batched.parallel.tensor import head_ranges

    # SmolLM2 (9 heads, 3 KV) over 2 ranks: whole KV groups, uneven.
    assert [head_ranges(9, 3, 2, r) for r in range(2)] == [((0, 6), (0, 2)), ((6, 9), (2, 3))]
    # Gemma 3 270M (4 heads, 1 KV) over 2 ranks: the KV head on both, query heads split.
    assert [head_ranges(4, 1, 2, r) for r in range(2)] == [((0, 2), (0, 1)), ((2, 4), (0, 1))]
    for heads, kv, size in ((8, 2, 4), (8, 2, 3), (12, 4, 8), (6, 3, 5), (32, 8, 3)):
        ranges = [head_ranges(heads, kv, size, r) for r in range(size)]
        queries = [h for (qa, qb), _ in ranges for h in range(qa, qb)]
        assert sorted(set(queries)) == list(range(heads)) and all(qb > qa for (qa, qb), _ in ranges)
        for (qa, qb), (ka, kb) in ranges:  # each rank holds the KV heads of its queries
            assert {q // (heads // kv) for q in range(qa, qb)} == set(range(ka, kb))
    with pytest.raises(ValueError, match="at most 4 ranks"):
        head_ranges(4, 1, 5, 0)


def test_a_layer_the_sharder_does_not_know_is_named():
    import mlx.nn as nn

    from mlx_lm_batched.parallel.shard import shard_model
    from mlx_lm_batched.layers.mlp import MLP

    class OddBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = MLP(8, 16)
            self.mixer = nn.Linear(8, 8)

    model = nn.Module()
    model.layers = [OddBlock()]
    with pytest.raises(ValueError, match=r"cannot shard layer 'layers\.0\.mixer' of OddBlock"):
        shard_model(model, TwoRanks())


def test_quantized_layer_split_off_group_boundaries_is_refused():
    import mlx.nn as nn

    from mlx_lm_batched.parallel.shard import shard_model
    from mlx_lm_batched.layers.attention import Attention

    model = nn.Module()
    model.attn = Attention(128, 6, 2, 64)  # rank 0 gets 3 heads = 192 columns of o_proj
    nn.quantize(model, group_size=128, bits=4)
    with pytest.raises(ValueError, match=r"'attn.o_proj'.*quantization groups of 128"):
        shard_model(model, TwoRanks())


def _one_layer(name, layer):
    import mlx.nn as nn

    block = nn.Module()
    setattr(block, name, layer)
    model = nn.Module()
    model.layers = [block]
    return model


def _quantized(model, group_size=32):
    import mlx.nn as nn

    nn.quantize(model, group_size=group_size, bits=4)
    return model


def _kimi_one_head():
    from mlx_lm_batched.layers.gated_delta import KimiDeltaAttention

    return _one_layer("self_attn", KimiDeltaAttention(64, 1, 16, 4, 1e-6))


def _mamba2_one_head():
    from mlx_lm_batched.models.mamba2 import Mamba2Mixer, SSDDims

    return _one_layer("mixer", Mamba2Mixer(64, SSDDims(1, 16, 8, 1, 4), 1e-6))


def _gated_delta_4bit():
    from mlx_lm_batched.layers.gated_delta import DeltaHeads, GatedDeltaNet

    return _quantized(_one_layer("linear_attn", GatedDeltaNet(64, DeltaHeads(2, 4, 8, 8), 4, 1e-6)))


def _short_conv_4bit():
    from mlx_lm_batched.layers.ssm import ShortConv

    return _quantized(_one_layer("conv", ShortConv(64, 3)), group_size=64)


@pytest.mark.parametrize("make,message", [
    # Fewer heads than ranks.
    (_kimi_one_head, r"cannot shard 'layers\.0\.self_attn': 1 heads over 2 ranks"),
    (_mamba2_one_head, r"cannot shard 'layers\.0\.mixer': 1 heads in 1 groups over 2 ranks"),
    # A 4-bit out_proj whose split (2 value heads of 8 = 16 columns) is not a whole group.
    (_gated_delta_4bit, r"'layers\.0\.linear_attn\.out_proj': input columns \[0, 16\) are "
                        r"not whole quantization groups of 32"),
    # 64 channels in one quantization group of 64: nothing for the second rank.
    (_short_conv_4bit, r"cannot shard 'layers\.0\.conv': 64 channels over 2 ranks in blocks of 64"),
])
def test_recurrent_layers_that_cannot_split_are_named(make, message):
    from mlx_lm_batched.parallel.shard import shard_model

    with pytest.raises(ValueError, match=message):
        shard_model(make(), TwoRanks())


def test_quantized_mamba2_mixer_shards_in_whole_groups():
    """8 heads in 2 groups, 4-bit in groups of 32: rank 0 keeps group 0 (4 heads)."""
    import mlx.nn as nn

    from mlx_lm_batched.parallel.shard import shard_model
    from mlx_lm_batched.models.mamba2 import Mamba2Mixer, SSDDims
    from mlx_lm_batched.parallel.sharded_layers import QuantizedShardedToAllLinear

    model = _quantized(_one_layer("mixer", Mamba2Mixer(64, SSDDims(8, 16, 8, 2, 4), 1e-6)))
    shard_model(model, TwoRanks())
    mixer = model.layers[0].mixer
    assert mixer.sizes == (64, 8, 1, 4, 16)  # channels, state, groups, heads, head size
    assert type(mixer.in_proj) is nn.QuantizedLinear
    assert mixer.in_proj.weight.shape[0] == 64 + 64 + 2 * 8 + 4  # gate, x, B, C, dt
    assert type(mixer.out_proj) is QuantizedShardedToAllLinear
    assert mixer.out_proj.scales.shape == (64, 2)  # 64 of 128 input columns: 2 groups
    assert mixer.conv1d.weight.shape[0] == 64 + 2 * 8 and mixer.norm.groups == 1


class _Rank:
    """Stands in for rank ``rank`` of a group of ``size`` where no collective runs
    (setting a pipeline stage up communicates nothing)."""

    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _tiny_llama(layers, tied=True, vocab=64):
    from mlx_lm_batched.models import llama

    return llama.Model(llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=layers,
                                       intermediate_size=64, num_attention_heads=4, vocab_size=vocab,
                                       num_key_value_heads=2, tie_word_embeddings=tied))


def test_pipeline_stages_keep_only_their_layers_and_parts():
    from mlx_lm_batched.parallel.pipeline import ZeroHead, pipeline_model

    first = pipeline_model(_tiny_llama(5), _Rank(2, 0))
    assert (first.stage.start, first.stage.stop) == (0, 2) and len(first.layers) == 2
    assert "embed_tokens" in first.model and "norm" not in first.model
    assert isinstance(first.lm_head, ZeroHead) and len(first.make_cache()) == 2
    last = pipeline_model(_tiny_llama(5), _Rank(2, 1))
    assert (last.stage.start, last.stage.stop) == (2, 5) and len(last.make_cache()) == 3
    assert "embed_tokens" in last.model and "lm_head" not in last  # tied: the head is the embedding
    untied = pipeline_model(_tiny_llama(5, tied=False), _Rank(2, 1))
    assert "embed_tokens" not in untied.model and "lm_head" in untied
    middle = pipeline_model(_tiny_llama(5), _Rank(3, 1))
    assert "embed_tokens" not in middle.model and isinstance(middle.lm_head, ZeroHead)
    assert (middle.stage.start, middle.stage.stop, middle.stage.vocab) == (2, 3, 64)


def test_pipeline_split_by_bytes_counts_the_embedding_and_head():
    from mlx_lm_batched.parallel.pipeline import layer_ranges, stage_ranges

    assert layer_ranges([1] * 30, 2) == [(0, 15), (15, 30)]
    assert layer_ranges([1] * 7, 3) == [(0, 2), (2, 5), (5, 7)]
    assert layer_ranges([1, 1, 1, 1], 2, first_extra=2) == [(0, 1), (1, 4)]
    # A large untied vocabulary: the first stage (embedding) and the last (head) take fewer blocks.
    model = _tiny_llama(8, tied=False, vocab=2048)
    assert stage_ranges(model, 3, "layers") == [(0, 3), (3, 5), (5, 8)]
    assert stage_ranges(model, 3, "bytes") == [(0, 1), (1, 7), (7, 8)]


def test_pipeline_refusals_name_the_problem():
    import mlx.nn as nn

    from mlx_lm_batched.parallel.pipeline import pipeline_model
    from mlx_lm_batched.utils import sharded_load

    with pytest.raises(ValueError, match="cannot split 1 layers into 2 pipeline stages"):
        pipeline_model(_tiny_llama(1), _Rank(2, 0))
    with pytest.raises(TypeError, match="needs a model built from the shared CausalLM"):
        pipeline_model(nn.Linear(2, 2), _Rank(2, 0))
    with pytest.raises(ValueError, match="split must be one of layers, bytes"):
        pipeline_model(_tiny_llama(2), _Rank(2, 0), split="heads")
    with pytest.raises(ValueError, match="pipeline_group and tensor_group cannot both"):
        sharded_load("unused", pipeline_group=_Rank(2, 0), tensor_group=_Rank(2, 0))
