"""Starting the prefill of admitted rows: their engine (a ``BatchEngine``, wrapped for
speculative decoding when the generator drafts) and its ``PrefillJob``, as one
:class:`~.batch_rows.Batch` that ``BatchGenerator`` advances one model call at a time."""

from ..cache import row_caches
from ..engine.batch_engine import BatchEngine
from ..engine.prefill_plan import left_pad
from ..engine.sampling import RowSampling
from ..engine.speculative import SpeculativeEngine, make_drafter
from .batch_rows import Batch


def start_prefill(model, rows, options, token_hook=None):
    """A :class:`Batch` prefilling ``rows`` (the scheduler's rows, admitted together) on
    ``model`` under the generator's ``options`` (a ``GeneratorOptions``).

    A single row continues a copy of the cache it came with (the caller's cache is never
    written); several rows start fresh, left-padded to their longest prompt. A row cut
    at its segments ends a call at each segment end; rows asking for prompt logprobs are
    scored. ``token_hook`` sees every sampled ``(B,)`` array."""
    cache = rows[0].cache if len(rows) == 1 else None
    cache = row_caches.copy_cache(cache) if row_caches.cache_length(cache) else None
    sampling = RowSampling([r.sampling for r in rows], options.return_logprobs, token_hook)
    engine = BatchEngine(model, cache, max_kv_size=options.max_kv_size,
                         prefill_step_size=options.prefill_step_size, sampling=sampling,
                         row_ids=[r.uid for r in rows], kv_quant=options.kv_quant,
                         adapters=[r.adapter for r in rows])
    if options.speculative:
        engine = SpeculativeEngine(engine, make_drafter(
            options.draft_model, options.prompt_lookup, max_kv_size=options.max_kv_size,
            prefill_step_size=options.prefill_step_size), options.num_draft_tokens)
    tokens, padding = left_pad([r.prompt for r in rows])
    engine.reserve(max(r.max_tokens for r in rows))
    cuts = rows[0].boundaries if len(rows) == 1 and rows[0].cut_at_segments else ()
    score = {i: r.prompt_logprobs for i, r in enumerate(rows) if r.prompt_logprobs is not None}
    return Batch(engine, job=engine.start_prefill(tokens, padding, cuts=cuts,
                                                  score=score or None))
