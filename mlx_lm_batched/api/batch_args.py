"""The arguments of ``batch_generate`` checked and put in per-row form before any work:
prompts encoded and checked against the vocabulary, ``max_tokens`` per row cut to the
context, prompt caches, samplers, processors and seeds one per row."""

from ..cache.row_caches import check_cache
from ..models.context import context_length
from ..sampling.grammar import make_grammar_processor
from ..tokenization.tokenizer import encode_prompt
from . import validation as V


def encode_prompts(tokenizer, prompts, vocab=None):
    """Token lists for prompts given as strings or token ids.

    Raises (naming the prompt index) for empty prompts, non-integer ids
    (``TypeError``) and ids outside ``[0, vocab)`` (``ValueError``).
    """
    encoded = []
    for i, p in enumerate(V.prompt_list(prompts)):
        ids = encode_prompt(tokenizer, p) if isinstance(p, str) else p
        encoded.append(V.token_list(ids, vocab, f"prompt {i}"))
    return encoded


def row_limits(model, encoded, max_tokens, cached=None):
    """Per-prompt ``max_tokens``, each cut to the model's context (one warning for all);
    ``cached[i]`` tokens already in prompt ``i``'s cache count against the context."""
    limits = V.per_row_max_tokens(max_tokens, len(encoded))
    cut = []
    for i, ids in enumerate(encoded):
        room = V.context_room(model, len(ids) + (cached[i] if cached else 0))
        if room is not None and room < 1:
            V.cap_max_tokens(model, limits[i], len(ids), what=f"prompt {i}")  # raises
        if room is not None and limits[i] > room:
            limits[i] = room
            cut.append(i)
    if cut:
        V.warn_context(f"max_tokens cut to fit the model's context "
                       f"({context_length(model)} tokens) for {len(cut)} prompt(s): "
                       f"{', '.join(map(str, cut[:8]))}{' ...' if len(cut) > 8 else ''}")
    return limits


def check_prompt_caches(prompt_caches, n):
    """``prompt_caches`` must be None or one prompt cache (or None) per prompt."""
    if prompt_caches is None:
        return None
    if not isinstance(prompt_caches, (list, tuple)) or len(prompt_caches) != n:
        got = (len(prompt_caches) if isinstance(prompt_caches, (list, tuple))
               else type(prompt_caches).__name__)
        raise ValueError(f"prompt_caches must be a list with one prompt cache per prompt "
                         f"({n}), got {got}")
    for i, c in enumerate(prompt_caches):
        if c is not None:
            check_cache(c, f"prompt_caches[{i}]")
    return list(prompt_caches)


def row_samplers(sampler, n):
    """One sampler (or None) per row from ``sampler``: a callable shared by all, a list
    with one per prompt, or a ``make_sampler`` sampler with one setting per prompt
    (cut into one sampler per row, since rows are reordered and leave the batch)."""
    if isinstance(sampler, (list, tuple)):
        if len(sampler) != n:
            raise ValueError(f"sampler list must have one sampler per prompt: expected {n}, "
                             f"got {len(sampler)}")
        for i, s in enumerate(sampler):
            if s is not None and not callable(s):
                raise TypeError(f"sampler[{i}] must be callable, got {type(s).__name__}")
        return list(sampler)
    rows = getattr(sampler, "rows", None)
    if rows is not None:
        if rows != n:
            raise ValueError(f"sampler has per-row settings for {rows} rows but there are "
                             f"{n} prompts")
        return [sampler.select([i]) for i in range(n)]
    return [sampler] * n


def per_row_lists(logits_processors):
    """Whether ``logits_processors`` is one list of processors per prompt."""
    return (isinstance(logits_processors, (list, tuple)) and len(logits_processors) > 0
            and isinstance(logits_processors[0], (list, tuple)))


def check_seeds(seeds, n):
    """None, or one int in [0, 2**64) or None per prompt."""
    if seeds is None:
        return None
    if not isinstance(seeds, (list, tuple)) or len(seeds) != n:
        raise ValueError(f"seeds must be a list with one seed (int or None) per prompt ({n}), "
                         f"got {seeds!r:.80}")
    for i, s in enumerate(seeds):
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**64):
            raise ValueError(f"seeds[{i}] must be an integer in [0, 2**64) or None, got {s!r}")
    return list(seeds)


def row_constraints(tokenizer, response_format, n):
    """None (no row constrained), or one list per prompt holding its own grammar
    processor (or nothing) for ``response_format``: one format for every prompt, or a
    list with one (or None) per prompt."""
    if response_format is None:
        return None
    if isinstance(response_format, (list, tuple)):
        if len(response_format) != n:
            raise ValueError(f"response_format list must have one entry (or None) per prompt: "
                             f"expected {n}, got {len(response_format)}")
        formats = list(response_format)
    elif isinstance(response_format, dict):
        formats = [response_format] * n
    else:
        raise TypeError(f"response_format must be a dict or a list of them, "
                        f"got {type(response_format).__name__}")
    rows = []
    for f in formats:
        p = None if f is None else make_grammar_processor(tokenizer, f)
        rows.append([] if p is None else [p])
    return rows
