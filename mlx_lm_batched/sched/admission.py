"""From requests to the scheduler's rows: mlx-lm's parallel lists (one entry per prompt
for every option of ``insert_segments``) turned into :class:`~.request.Request`\\ s, and
requests turned into checked :class:`Row`\\ s with the generator's defaults filled in.
Each problem is one ``ValueError`` line naming the prompt, before anything is queued."""

from ..engine.sampling import RowSampler, TokenContext
from ..sampling.samplers import greedy_sampler
from . import capabilities
from .request import Request, check_max_tokens
from .batch_rows import Row

# insert_segments' per-prompt lists -> the Request field each entry fills.
LIST_FIELDS = {"max_tokens": "max_tokens", "caches": "cache", "all_tokens": "cached_tokens",
               "samplers": "sampler", "logits_processors": "logits_processors",
               "stop_sequences": "stop_sequences", "seeds": "seed",
               "prompt_logprobs": "prompt_logprobs", "adapters": "adapter"}


def seeded_sampler(sampler, seed, uid):
    """``sampler`` with its own random stream for ``seed`` (greedy and None seeds: as is)."""
    if seed is None or sampler is greedy_sampler:
        return sampler
    if not hasattr(sampler, "seeded"):
        raise ValueError(f"seeds: prompt {uid}'s sampler cannot be seeded (a custom "
                         f"callable); use make_sampler(...) or make_seeded_sampler(...)")
    return sampler.seeded(seed)


def requests_from_lists(segments, first_uid, lists):
    """One :class:`Request` per prompt of ``segments`` (token-id segments per prompt),
    to become rows ``first_uid, first_uid + 1, ...``. ``lists``: name (``LIST_FIELDS``)
    -> one value per prompt, or None (empty) for the generator's default."""
    n = len(segments)
    per_row = {}
    for name, values in lists.items():
        if values is not None and not hasattr(values, "__len__"):
            raise ValueError(f"{name} must be a list with one entry per prompt, got "
                             f"{type(values).__name__} {values!r}")
        if not values:
            continue
        if len(values) != n:
            raise ValueError(f"{name} must have one entry per prompt: expected {n}, "
                             f"got {len(values)}")
        per_row[name] = values
    requests = []
    for i, segs in enumerate(segments):
        fields = {LIST_FIELDS[k]: v[i] for k, v in per_row.items()}
        if "logits_processors" in per_row:  # a row's None in a given list: no processors
            fields["logits_processors"] = tuple(fields["logits_processors"] or ())
        if fields.get("cached_tokens") is None:
            fields.pop("cached_tokens", None)
        requests.append(Request(segs, label=f"prompt {first_uid + i}",
                                cache_label=f"caches[{i}]", **fields))
    return requests


def build_rows(requests, first_uid, options, default_stops, adapter_slots):
    """Rows ``first_uid, first_uid + 1, ...`` for ``requests``; ``options`` (the
    generator's :class:`~.options.GeneratorOptions`) and ``default_stops`` fill what a
    request leaves None. Raises ValueError (an adapter slot the model lacks, a custom
    sampler with a seed, ...)."""
    for r in requests:
        if not isinstance(r, Request):
            raise TypeError(f"insert_requests takes Request objects, got {type(r).__name__}")
        a = r.adapter
        if a is not None and (not isinstance(a, int) or not 0 <= a < adapter_slots):
            raise ValueError(f"adapters: slot {a!r} is not one of this model's "
                             f"{adapter_slots} (0: the base, 1..: its adapters)")
    if options.speculative and any(options.logits_processors if r.logits_processors is None
                                   else r.logits_processors for r in requests):
        capabilities.check(options.features | {"logits_processors"})
    return [_row(first_uid + i, r, options, default_stops) for i, r in enumerate(requests)]


def _row(uid, request, options, default_stops):
    segs = [list(s) for s in request.segments]
    max_tokens = options.max_tokens if request.max_tokens is None else request.max_tokens
    check_max_tokens(max_tokens, f"prompt {uid}")
    several = len(segs) > 1
    if len(segs[-1]) != 1:  # the last token starts generation: its own segment
        segs = segs[:-1] + [segs[-1][:-1], segs[-1][-1:]]
    prompt = [t for s in segs for t in s]
    ends = [sum(len(s) for s in segs[: j + 1]) for j in range(len(segs))]
    held = list(request.cached_tokens)
    processors = (options.logits_processors if request.logits_processors is None
                  else request.logits_processors)
    sampler = seeded_sampler(request.sampler or options.sampler or greedy_sampler,
                             request.seed, uid)
    sampling = RowSampler(sampler, processors, TokenContext(held + prompt) if processors else None)
    stops = request.stop_sequences if request.stop_sequences is not None else default_stops
    adapter = -1 if request.adapter is None else request.adapter
    return Row(uid, prompt, ends, max_tokens, request.cache, held, sampling, stops.matcher(),
               cut_at_segments=several, prompt_logprobs=request.prompt_logprobs,
               adapter=adapter)
