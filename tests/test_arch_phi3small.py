"""Phi-3-small (``phi3small``; transformers has no model for it), with mlx-lm 0.32 as
the oracle for everything but the block-sparse pattern.

mlx-lm is not an exact reference for Phi-3-small's block-sparse layers: it adds its
boolean causal mask to the scores (future keys inside a block stay visible) and
takes the last rows of a block-padded grid (the block grid shifts unless the length
is a multiple of the block size). So:

* ``phi3small_dense``: every layer dense (``dense_attention_every_n_layers=1``, as
  Microsoft's code reads it), against mlx-lm with its layers run dense;
* ``phi3small``: layer 0 block-sparse, layer 1 dense, against mlx-lm's dense math
  with the block-sparse layer's mask replaced by :func:`reference_block_mask`, a
  slow, obvious numpy statement of Microsoft's per-head pattern (small blocks so
  short prompts cross many of them).

Both run the harness's four checks (padding, greedy rows, chunked prefill +
decode, rows joining a running generator) in both config layouts.
"""

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from arch_harness import VOCAB, make_prompts, run_family
from mlx_lm_batched.layers.masks import BlockSparse, causal_mask

BASE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, ff_intermediate_size=48, gegelu_limit=2.0,
            layer_norm_epsilon=1e-5, mup_attn_multiplier=4.0, mup_embedding_multiplier=2.0,
            mup_width_multiplier=4.0, rope_embedding_base=10000.0, rope_theta=10000.0,
            blocksparse_block_size=32)
# The checkpoint's block pattern: 4-token blocks, the 2 latest blocks local, every 3rd
# block a vertical stripe (per-head shifted). mlx-lm's constructor only accepts blocks
# of 32 or 64, so its model is built with 32 and the saved config is rewritten.
PATTERN = dict(blocksparse_block_size=4, blocksparse_num_local_blocks=2,
               blocksparse_vert_stride=3)
LENGTHS = dict(lengths=(13, 1, 22, 6), gen_lengths=(9, 3, 17), new_tokens=12)


def reference_block_mask(n_heads, q_len, kv_len, block, local, stride, homo=False):
    """``(heads, q_len, kv_len)`` bools for the last ``q_len`` of ``kv_len`` tokens of
    one unpadded sequence, by Microsoft's definition: causal, and the key's block is
    among the query block's ``local`` latest or is one of the head's vertical blocks."""
    step = 0 if homo else max(1, stride // n_heads)
    mask = np.zeros((n_heads, q_len, kv_len), bool)
    for h in range(n_heads):
        for i in range(q_len):
            q = kv_len - q_len + i
            for k in range(q + 1):
                local_block = q // block - k // block < local
                vertical = (k // block + h * step + 1) % stride == 0
                mask[h, i, k] = local_block or vertical
    return mask


def _oracle_fixes(model):
    """mlx-lm's Phi-3-small writes -inf to token ids past a tiny vocabulary (a crash):
    there are none to hide here."""
    model._dummy_tokenizer_ids = mx.array([], mx.int32)


def _all_dense(model):
    _oracle_fixes(model)
    for layer in model.layers:
        layer.self_attn.block_sparse = False


def _numpy_pattern(model):
    """The block-sparse layers of mlx-lm's model take their mask from
    ``reference_block_mask`` (the oracle's own boolean causal mask it adds to the
    scores shifts every visible score by the same 1: softmax is unchanged)."""
    _oracle_fixes(model)
    for layer in model.layers:
        attn = layer.self_attn
        if attn.block_sparse:
            def mask(q_len, kv_len, attn=attn):
                m = reference_block_mask(attn.n_heads, q_len, kv_len,
                                         PATTERN["blocksparse_block_size"],
                                         PATTERN["blocksparse_num_local_blocks"],
                                         PATTERN["blocksparse_vert_stride"])
                return None, mx.array(m.reshape(attn.n_kv_heads, attn.n_q_per_kv, q_len, kv_len))
            attn._block_sparse_mask = mask


def _rewrite(updates):
    """Rewrite the saved config: ``updates``, and a transformers-5 config (RoPE in
    ``rope_parameters``) loses ``rope_embedding_base`` so the base must come from there."""
    def rewrite(directory):
        path = Path(directory) / "config.json"
        config = dict(json.loads(path.read_text()), **updates)
        if "rope_parameters" in config:
            config.pop("rope_embedding_base")
        path.write_text(json.dumps(config))
    return rewrite


FAMILIES = {
    "phi3small": (dict(BASE, dense_attention_every_n_layers=2),
                  dict(oracle="mlx_lm", hf_hook=_numpy_pattern, rewrite=_rewrite(PATTERN),
                       **LENGTHS)),
    "phi3small_dense": (dict(BASE, dense_attention_every_n_layers=1),
                        dict(oracle="mlx_lm", model_type="phi3small", hf_hook=_all_dense,
                             rewrite=_rewrite({}), **LENGTHS)),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_mlx_lm_and_batches_exactly(name, layout):
    model = run_family(name, FAMILIES[name], layout)
    if name == "phi3small":
        # The pattern is not a no-op on these lengths: dense attention everywhere
        # moves the logits far past the tolerance.
        p = make_prompts([22])[0]
        dense = [causal_mask(len(p), mx.array([0]))] * 2
        x = mx.array([p])
        assert np.abs(np.array(model(x)) - np.array(model(x, mask=dense))).max() > 1e-2


@pytest.mark.parametrize("homo", [False, True])
def test_block_sparse_mask_matches_reference_under_padding_and_cache(homo):
    """The mask kind itself, per head and per row: left-padded rows and a cached
    continuation see each row's own block grid (Microsoft's pattern counted from
    the row's first real token); 8 heads over stride 3 shift by 1 each (wrapping),
    2 heads over stride 7 by 3."""
    for n_heads, stride in ((8, 3), (2, 7)):
        pattern = BlockSparse(4, 2, stride, n_heads, homo)
        lengths = (23, 9, 1)
        L = max(lengths)
        offset = mx.array([n - L for n in lengths])
        mask = np.array(causal_mask(L, offset, block_sparse=pattern))
        assert mask.shape == (3, n_heads, L, L)
        for b, n in enumerate(lengths):
            want = reference_block_mask(n_heads, n, n, 4, 2, stride, homo)
            np.testing.assert_array_equal(mask[b, :, L - n:, L - n:], want)
            assert not mask[b, :, L - n:, :L - n].any()  # padding keys stay hidden
        # Decode: 5 more tokens after the padded prefill, keys = all slots so far.
        from mlx_lm_batched.layers.masks import attention_mask
        step = np.array(attention_mask(mx.arange(L + 5), L, 5, offset + L, block_sparse=pattern))
        for b, n in enumerate(lengths):
            want = reference_block_mask(n_heads, 5, n + 5, 4, 2, stride, homo)
            np.testing.assert_array_equal(step[b, :, :, L - n:], want)


class _RankZeroOfTwo:
    """Rank 0 of a 2-rank group, where sharding itself needs no collective."""

    def size(self):
        return 2

    def rank(self):
        return 0


def test_tensor_parallel_refuses_phi3small_by_name():
    from mlx_lm_batched.models.phi3small import Model, ModelArgs
    from mlx_lm_batched.parallel.shard import shard_model

    model = Model(ModelArgs.from_dict(dict(BASE, model_type="phi3small",
                                           dense_attention_every_n_layers=2)))
    with pytest.raises(ValueError, match="cannot shard layer 'model.layers.0.self_attn'.*"
                                         "block-sparse pattern is per head"):
        shard_model(model, _RankZeroOfTwo())


def test_config_errors_name_the_problem():
    """Phi-3-small-128k's LongRoPE is refused (not silently ignored, as mlx-lm does)."""
    from mlx_lm_batched.models.phi3small import ModelArgs

    config = dict(BASE, model_type="phi3small", dense_attention_every_n_layers=2)
    su = {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    with pytest.raises(NotImplementedError, match="rope_scaling type 'su' is not supported"):
        ModelArgs.from_dict(dict(config, rope_scaling=su))
    with pytest.raises(ValueError, match="dense_attention_every_n_layers must be >= 1"):
        ModelArgs.from_dict(dict(config, dense_attention_every_n_layers=0))
    with pytest.raises(ValueError, match="block-sparse block_size must be >= 1"):
        BlockSparse(0, 2, 3, 4)
