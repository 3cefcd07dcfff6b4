"""The batch driver: it alone owns each row's padding, position and sampling state.

A ``BatchEngine`` runs one left-padded batch through a model: prefill (a
:class:`~.prefill.PrefillJob`, one model call at a time), then one decode step at a time.
Each row's padding lives with the batch's caches (the ``PromptCache``), so a later call
on the same caches continues every row exactly; the engine reads it to hand the model
each row's position (``offset``) and any per-step attention data, and records what a
prefill adds. The engine also owns, in its row order, each row's sampling state
(``sampling``) and an optional label per row (``row_ids``): rows can be dropped
(``filter``) or joined from another engine (``extend``) and everything follows.
"""

import mlx.core as mx

from ..cache.factory import make_prompt_cache
from ..cache.kv import KVCache
from ..cache.prompt_cache import as_prompt_cache
from ..cache.row_blocks import uncovered
from ..cache.quantized import (QuantizedKVCache, check_kv_quantization, quantize_prompt_cache,
                               to_quantized)
from ..cache.row_caches import cache_nbytes, extract_row
from ..layers.lora import adapter_rows
from ..layers.step import StepAttention
from ..models.context import context_length
from .kv_budget import check_kv_fits
from .prefill import PrefillJob
from .prefill_plan import DECODE_GROUP_OVERHEAD_KEYS, plan_block_merges, plan_prefill_groups
from .sampling import SharedSampling


class BatchEngine:
    """Prefill and decode one batch of rows that share a cache.

    ``prompt_cache``: the batch's caches (``make_prompt_cache``; a plain list of layer
    caches counts as unpadded rows), new ones when None. Its rows' padding is the one
    record of each row's position: ``offset`` and ``left_padding`` read it.
    ``sampling``: a :class:`~.sampling.SharedSampling` (default: greedy) or
    :class:`~.sampling.RowSampling`. ``row_ids``: a label per row, kept in row order.
    ``kv_quant``: a :class:`KVQuantization` (quantized KV caches) or None.
    ``adapters``: each row's adapter slot (``layers.lora``; -1: the model's default), kept
    in row order like ``row_ids`` and handed to every model call; None: all default.
    """

    def __init__(self, model, prompt_cache=None, *, max_kv_size=None, prefill_step_size=2048,
                 sampling=None, row_ids=None, kv_quant=None, adapters=None):
        self.model = model
        self.kv_quant = kv_quant
        self.sampling = sampling if sampling is not None else SharedSampling()
        if prompt_cache is None:
            prompt_cache = make_prompt_cache(model, max_kv_size)
        self.cache = as_prompt_cache(prompt_cache)
        self.prefill_step_size = max(1, int(prefill_step_size))
        self.row_ids = None if row_ids is None else list(row_ids)
        self.adapters = None if adapters is None else [int(a) for a in adapters]
        self.decode_reserve = 0  # expected decode steps (sizes the caches)
        self._decode_groups = None  # decode attention row groups (``_plan_decode_groups``)
        self.rows_changed()

    def reserve(self, new_tokens):
        """Expect about ``new_tokens`` decode steps. The caches reserve at most a
        bounded step ahead of what they hold (see ``KVCache.reserve``), and the
        next prefill checks that the batch's caches can fit at their longest."""
        self.decode_reserve = max(0, int(new_tokens))

    @property
    def slots(self):
        return self.cache.slots

    @property
    def rows(self):
        """Rows in the batch (0 before the first prefill)."""
        padding = self.cache.padding
        return 0 if padding is None else len(padding)

    @property
    def offset(self):
        """``(B,)`` real tokens per row in the cache (None before any row)."""
        padding = self.cache.padding
        return None if padding is None else self.cache.offsets(len(padding))

    @property
    def left_padding(self):
        """``(B,)`` pad slots per row: every row fills the same number of slots."""
        padding = self.cache.padding
        return None if padding is None else mx.array(padding, dtype=mx.int32)

    def reserve_for(self, rows, slots):
        """Check and reserve memory for ``rows`` rows reaching ``slots`` + the expected
        decode steps (at most the model's context)."""
        ahead = self.decode_reserve
        context = context_length(self.model)
        if context is not None:
            ahead = min(ahead, context)
        check_kv_fits(self.model, self.cache, rows, slots + ahead, self.kv_quant)
        self.cache.reserve(slots + ahead)

    def start_prefill(self, tokens, left_padding=None, input_embeddings=None, cuts=(), score=None):
        """A :class:`~.prefill.PrefillJob` feeding the ``(B, L)`` prompt, one model call per
        ``advance()``; its ``result`` is the queued ``(tokens, logprobs)`` of step one.

        ``left_padding[b]``: pad columns before row ``b``'s tokens. On caches that
        already hold rows (a later turn), each row's new tokens follow its cached ones
        directly and its pad columns join its leading padding. ``cuts``: columns where a
        call must end (prompt segments). ``score``: ``{row: top alternatives}`` of rows
        whose prompt tokens' log-probabilities the job keeps (``job.scores``).
        """
        B, L = tokens.shape
        if L == 0:
            raise ValueError("empty prompt: nothing to generate from")
        pad = [0] * B if left_padding is None else [int(p) for p in left_padding]
        if len(pad) != B or any(p < 0 or p >= L for p in pad):
            raise ValueError(f"left_padding must give 0 <= padding < {L} for each of the "
                             f"{B} rows, got {pad}")
        return PrefillJob(self, tokens, pad, input_embeddings, cuts, score)

    def prefill(self, tokens, left_padding=None, progress=None, input_embeddings=None):
        """Feed the ``(B, L)`` prompt at once; return the queued ``(tokens, logprobs)`` of
        step one (see :meth:`start_prefill`); ``progress(done, total)`` after each chunk."""
        return self.start_prefill(tokens, left_padding, input_embeddings).run(progress)

    def step(self, tokens):
        """Feed one token per row ``(B,)``; return the queued next ``(tokens, logprobs)``."""
        self.sampling.fed(tokens)
        kwargs = {}
        if self._decode_groups:
            kwargs["attention"] = StepAttention(row_groups=self._decode_groups)
        with adapter_rows(self.adapter_slots()):
            logits = self.model(tokens[:, None], offset=self.offset, cache=self.cache, **kwargs)
        self.quantize_caches()
        return self.sampling.sample(logits[:, -1, :])

    def adapter_slots(self, rows=slice(None)):
        """The adapter slot of each row in ``rows`` as an ``(B,)`` array, or None when
        every row is on the model's default (see ``layers.lora.adapter_rows``)."""
        if self.adapters is None:
            return None
        picked = self.adapters[rows]
        if all(a < 0 for a in picked):
            return None
        return mx.array(picked, dtype=mx.int32)

    def quantize_caches(self):
        """After a model call: quantize the key/value caches that hold at least
        ``kv_quant.start`` slots (mlx-lm's ``maybe_quantize_kv_cache`` rule)."""
        q = self.kv_quant
        if q is not None and quantize_prompt_cache(self.cache, q.bits, q.group_size, q.start):
            self.rows_changed()

    def rows_changed(self):
        """Plan decode attention row groups from the rows' padding (call after the rows
        or their padding change).

        Every row attends over all the batch's slots, most of them padding for the
        short rows. On the CPU, where attention is a large share of a batched decode
        step, the shared ``Attention`` layer splits the rows into contiguous groups
        ``(start, stop, first_slot)`` that each skip the slots padding for the whole
        group (same result: those keys are masked). Devices with fused attention
        (``mx.fast``) keep one call; so do ring caches, whose slots are not in order.
        Each step adds one key to every row, which adds the same cost to every
        grouping, so the plan holds until the padding changes.
        """
        self._decode_groups = None
        padding = self.cache.padding
        if padding is None or not self.groups_rows():
            return
        blocks = self._row_blocks()
        if blocks is not None:
            # One group per row block (it reads the block's buffer): neighbouring blocks
            # merge where one attention call over both costs less than two.
            spans = plan_block_merges(blocks, self.cache.slots)
            if len(spans) < len(blocks):
                for c in self.cache:
                    c.merge_blocks(spans)
                blocks = self._row_blocks()
            self._decode_groups = [(b.start, b.stop, min(padding[b.start:b.stop]))
                                   for b in blocks]
        elif len(padding) > 1:
            groups = _plan_decode_groups(padding)
            if len(groups) > 1:
                self._decode_groups = groups

    def groups_rows(self):
        """True when decode attention runs by row groups and fresh prompts are stored
        by row blocks (``cache/row_blocks.py``): on the CPU, for models whose caches are
        all full key/value caches (devices with fused attention keep one call; ring
        caches do not hold their slots in order)."""
        return mx.default_device() == mx.cpu and all(type(c) is KVCache for c in self.cache)

    def _row_blocks(self):
        """The row blocks of the first layer cache stored by them (all such layers
        have the same), or None."""
        return next((c.blocks for c in self.cache if getattr(c, "blocks", None) is not None),
                    None)

    def block_groups(self, rows):
        """One attention row group per row block, for a call on ``rows`` rows before
        their padding is recorded (a prefill's last column), or None when the caches
        hold no blocks."""
        blocks = self._row_blocks()
        if blocks is None or not self.groups_rows():
            return None
        covered = [(b.start, b.stop, b.first) for b in blocks]
        # Rows with no block yet (nothing before their last column) get one at the call.
        gaps = [(a, z, self.cache.slots) for a, z in uncovered(blocks, rows)]
        return sorted(covered + gaps)

    def extract_row(self, row, views=False):
        """Row ``row``'s caches as a one-row prompt cache without padding (see
        ``cache.row_caches.extract_row``; ``views``: slices of this batch's buffers, to
        be let go before its next step)."""
        pad = self.cache.padding[row] if self.cache.padding else 0
        return extract_row(self.cache, row, pad, views)

    @property
    def nbytes(self):
        """Bytes held by this batch's caches."""
        return cache_nbytes(self.cache)

    def filter(self, keep):
        """Keep only rows ``keep`` (list of indices); drop padding they all share."""
        self.cache.filter(keep)
        self.sampling.filter(keep)
        if self.row_ids is not None:
            self.row_ids = [self.row_ids[i] for i in keep]
        if self.adapters is not None:
            self.adapters = [self.adapters[i] for i in keep]
        self.rows_changed()

    def extend(self, other):
        """Append the rows of ``other``, a ``BatchEngine`` on the same model prefilled on
        its own caches, to this batch (continuous batching: rows join mid-decode).

        The caches join with their rows' padding (``PromptCache.extend`` left-pads the
        side with fewer slots); sampling state and row labels follow. ``other`` must not
        be used afterwards (its arrays are shared).
        """
        mine, theirs = self.rows, other.rows
        self._match_quantization(other.cache)
        if self.groups_rows() and other.groups_rows():
            # Each side's rows keep their own buffers: the join copies nothing and the
            # short rows never take the long rows' slots (``cache/row_blocks.py``).
            for c in [*self.cache, *other.cache]:
                c.to_blocks()
        self.cache.extend(other.cache)
        # Its caches' arrays are ours now: let its references go before the blocks
        # merge (``rows_changed``), so that each layer's originals go as its copy is made.
        other.cache = None
        self.sampling.extend(other.sampling)
        if self.row_ids is not None or other.row_ids is not None:
            self.row_ids = (self.row_ids or []) + (other.row_ids or [])
        if self.adapters is not None or other.adapters is not None:
            self.adapters = ((self.adapters if self.adapters is not None else [-1] * mine)
                             + (other.adapters if other.adapters is not None else [-1] * theirs))
        self.decode_reserve = max(self.decode_reserve, other.decode_reserve)
        self.rows_changed()

    def _match_quantization(self, other):
        """Layers that are quantized on one side only (one batch passed
        ``kv_quant.start`` slots, the other not yet) are quantized on both before
        they join (quantizing a slot depends on that slot alone)."""
        for i, (a, b) in enumerate(zip(self.cache, other)):
            qa, qb = isinstance(a, QuantizedKVCache), isinstance(b, QuantizedKVCache)
            if qa and not qb:
                other[i] = to_quantized(b, a.group_size, a.bits)
            elif qb and not qa:
                self.cache[i] = to_quantized(a, b.group_size, b.bits)


def _plan_decode_groups(padding):
    """Decode attention groups ``(start, stop, first_slot)`` of a batch's rows: the split
    that least costs attending the slots padding for a whole group."""
    keys = max(padding) + 1  # any count above every row's padding plans the same
    groups = plan_prefill_groups([keys - p for p in padding], DECODE_GROUP_OVERHEAD_KEYS,
                                 float("inf"))
    return [(a, b, min(padding[a:b])) for a, b in groups]


class KVQuantization:
    """Quantized KV caches (mlx-lm's ``kv_bits``, ``kv_group_size``,
    ``quantized_kv_start``): key/value layer caches are quantized to ``bits`` in groups
    of ``group_size`` after the first model call that leaves them holding at least
    ``start`` slots; from then on every slot is stored quantized."""

    def __init__(self, bits, group_size=64, start=0):
        check_kv_quantization(bits, group_size)
        self.bits, self.group_size, self.start = bits, group_size, int(start)

    @classmethod
    def of(cls, bits, group_size=64, start=0):
        """A ``KVQuantization`` for ``bits``, or None when ``bits`` is None."""
        return None if bits is None else cls(bits, group_size, start)
