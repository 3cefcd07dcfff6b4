"""Turning ``BatchGenerator.insert_segments``' arguments into checked :class:`Row`s: one
entry per prompt for every option, defaults where the caller gave none, each problem as
one ``ValueError`` line naming the prompt, before anything is queued."""

from ..cache import row_caches
from ..engine.sampling import RowSampler, TokenContext
from ..sampling.samplers import greedy_sampler
from .batch_rows import Row


def seeded_sampler(sampler, seed, uid):
    """``sampler`` with its own random stream for ``seed`` (greedy and None seeds: as is)."""
    if seed is None or sampler is greedy_sampler:
        return sampler
    if not hasattr(sampler, "seeded"):
        raise ValueError(f"seeds: prompt {uid}'s sampler cannot be seeded (a custom "
                         f"callable); use make_sampler(...) or make_seeded_sampler(...)")
    return sampler.seeded(seed)


def build_rows(segments, first_uid, options, defaults, adapter_slots):
    """Rows ``first_uid, first_uid + 1, ...`` for ``segments`` (a list of token-id
    segments per prompt). ``options``: name -> one value per prompt, or None for the
    ``defaults`` (name -> the generator's value for every prompt). Raises ValueError."""
    n = len(segments)
    per_row = {}
    for name, default in defaults.items():
        values = options.get(name)
        if values is not None and not hasattr(values, "__len__"):
            raise ValueError(f"{name} must be a list with one entry per prompt, got "
                             f"{type(values).__name__} {values!r}")
        values = values if values else [default] * n
        if len(values) != n:
            raise ValueError(f"{name} must have one entry per prompt: expected {n}, "
                             f"got {len(values)}")
        per_row[name] = values
    for a in per_row["adapters"]:
        if a is not None and (not isinstance(a, int) or not 0 <= a < adapter_slots):
            raise ValueError(f"adapters: slot {a!r} is not one of this model's "
                             f"{adapter_slots} (0: the base, 1..: its adapters)")
    return [_row(i, first_uid + i, segs, {k: v[i] for k, v in per_row.items()}, defaults)
            for i, segs in enumerate(segments)]


def _row(i, uid, segs, o, defaults):
    segs = [[int(t) for t in s] for s in segs if len(s)]
    if not segs:
        raise ValueError(f"prompt {uid} is empty: nothing to generate from")
    if o["caches"] is not None:
        row_caches.check_cache(o["caches"], f"caches[{i}]")
    if o["max_tokens"] <= 0:
        raise ValueError(f"max_tokens of prompt {uid} must be > 0, got {o['max_tokens']}")
    top = o["prompt_logprobs"]
    if top is not None and (not isinstance(top, int) or top < 0):
        raise ValueError(f"prompt_logprobs of prompt {uid} must be None or an int "
                         f">= 0, got {top!r}")
    several = len(segs) > 1
    if len(segs[-1]) != 1:  # the last token starts generation: its own segment
        segs = segs[:-1] + [segs[-1][:-1], segs[-1][-1:]]
    prompt = [t for s in segs for t in s]
    ends = [sum(len(s) for s in segs[: j + 1]) for j in range(len(segs))]
    held = list(o["all_tokens"] or [])
    processors = tuple(o["logits_processors"] or ())
    sampler = seeded_sampler(o["samplers"] or defaults["samplers"], o["seeds"], uid)
    sampling = RowSampler(sampler, processors, TokenContext(held + prompt) if processors else None)
    stops = o["stop_sequences"] if o["stop_sequences"] is not None else defaults["stop_sequences"]
    adapter = -1 if o["adapters"] is None else o["adapters"]
    return Row(uid, prompt, ends, o["max_tokens"], o["caches"], held, sampling, stops.matcher(),
               cut_at_segments=several, prompt_logprobs=top, adapter=adapter)
