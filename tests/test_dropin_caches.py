"""mlx-lm's cache classes and methods that code written for it calls, against mlx-lm as
the oracle: ``BatchKVCache`` lists driving a model over a left-padded batch."""

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map

CONFIG = dict(model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=64,
              tie_word_embeddings=True)


def _models():
    import mlx_lm.models.llama as theirs

    from mlx_lm_batched.models import llama as ours

    ref = theirs.Model(theirs.ModelArgs(**CONFIG))
    mx.random.seed(5)
    ref.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, ref.parameters()))
    model = ours.Model(ours.ModelArgs(**CONFIG))
    model.load_weights(list(tree_flatten(ref.parameters())))
    return model, ref


def test_batch_kv_cache_list_runs_a_left_padded_batch_as_mlx_lm():
    """Prefill then two decode steps of a left-padded batch through per-layer
    ``BatchKVCache`` lists: the real rows' logits, each row's ``offset`` and
    ``left_padding`` are mlx-lm's; the padded row's logits are the row's alone."""
    from mlx_lm.models.cache import BatchKVCache as Theirs

    from mlx_lm_batched.models.cache import BatchKVCache as Ours
    from mlx_lm_batched.models.cache import make_prompt_cache

    model, ref = _models()
    pads = [3, 0]
    batch = mx.array([[0, 0, 0, 7, 8, 9], [1, 2, 3, 4, 5, 6]])
    ours, theirs = [Ours(pads) for _ in model.layers], [Theirs(pads) for _ in ref.layers]
    steps = [batch, mx.array([[11], [12]]), mx.array([[13], [14]])]
    for tokens in steps:
        got, want = model(tokens, cache=ours), ref(tokens, cache=theirs)
        np.testing.assert_allclose(np.array(got[1]), np.array(want[1]), atol=1e-4)
        np.testing.assert_allclose(np.array(got[0, -1]), np.array(want[0, -1]), atol=1e-4)
        assert ours[0].offset.tolist() == theirs[0].offset.tolist()
        assert ours[0].left_padding.tolist() == theirs[0].left_padding.tolist()
    alone = make_prompt_cache(model)
    row = model(mx.array([[7, 8, 9]]), cache=alone)
    for tokens in steps[1:]:
        row = model(tokens[:1], cache=alone)
    np.testing.assert_allclose(np.array(got[0, -1]), np.array(row[0, -1]), atol=1e-4)


def test_batch_kv_cache_filter_and_extend_keep_offsets_as_mlx_lm():
    from mlx_lm.models.cache import BatchKVCache as Theirs

    from mlx_lm_batched.models.cache import BatchKVCache as Ours

    kv = lambda n, b: (mx.ones((b, 2, n, 4)), mx.ones((b, 2, n, 4)))
    ours, theirs = Ours([2, 0, 1]), Theirs([2, 0, 1])
    other_ours, other_theirs = Ours([0]), Theirs([0])
    for c in (ours, theirs):
        c.update_and_fetch(*kv(5, 3))
    for c in (other_ours, other_theirs):
        c.update_and_fetch(*kv(2, 1))
    ours.extend(other_ours)
    theirs.extend(other_theirs)
    assert ours.offset.tolist() == theirs.offset.tolist() == [3, 5, 4, 2]
    ours.filter([2, 3])
    theirs.filter(mx.array([2, 3]))
    assert ours.offset.tolist() == theirs.offset.tolist() == [4, 2]
    assert ours.keys_and_values()[0].shape[0] == 2


def test_kv_cache_to_quantized_holds_mlx_lm_triples():
    """``KVCache.to_quantized`` gives mlx-lm's quantized keys and values
    (``keys_and_values()``: packed, scales, biases), which keep growing as mlx-lm's do."""
    from mlx_lm.models.cache import KVCache as Theirs

    from mlx_lm_batched.models.cache import KVCache as Ours
    from mlx_lm_batched.models.cache import QuantizedKVCache

    k = mx.random.normal((2, 2, 40, 64), key=mx.random.key(4))
    v = mx.random.normal((2, 2, 40, 64), key=mx.random.key(5))
    ours, theirs = Ours(), Theirs()
    ours.update_and_fetch(k, v)
    theirs.update_and_fetch(k, v)
    quant_ours = ours.to_quantized(group_size=32, bits=8)
    quant_theirs = theirs.to_quantized(group_size=32, bits=8)
    assert isinstance(quant_ours, QuantizedKVCache) and quant_ours.offset == 40
    assert (quant_ours.group_size, quant_ours.bits) == (32, 8)
    assert ours.to_quantized().bits == 4  # mlx-lm's default
    step = mx.ones((2, 2, 1, 64))
    quant_ours.update_and_fetch(step, step)
    quant_theirs.update_and_fetch(step, step)
    for a, b in zip(quant_ours.keys_and_values(), quant_theirs.keys_and_values()):
        for x, y in zip(a, b):
            assert mx.array_equal(x, y).item()
