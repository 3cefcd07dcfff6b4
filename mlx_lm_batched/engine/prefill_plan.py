"""How a batch's prompts are laid out and cut for prefill: left padding, and the split
of length-sorted rows into groups that skip the columns padding for all their rows."""

import mlx.core as mx

# Prefill groups (see ``plan_prefill_groups``). Each forward call reads every weight
# once, so a call costs about as much as this many extra tokens; a group never
# exceeds the token budget (bounds activation memory) unless it is a single row.
# On the CPU small groups are also faster (activations stay in cache) and keep the
# prefill's transient memory to a few tens of MB; accelerators prefer big calls.
GROUP_OVERHEAD_TOKENS = 64
GROUP_TOKEN_BUDGET = 4096
GROUP_TOKEN_BUDGET_CPU = 512
# Decode attention groups (see ``BatchEngine._plan_decode_groups``): on the CPU one
# more group costs about as much as attending this many extra (row, key) pairs.
DECODE_GROUP_OVERHEAD_KEYS = 256


def left_pad(prompts, pad_id=0):
    """``(B, L)`` array of left-padded prompts and the ``(B,)`` padding per row."""
    width = max(len(p) for p in prompts)
    padding = [width - len(p) for p in prompts]
    rows = [[pad_id] * n + [int(t) for t in p] for n, p in zip(padding, prompts)]
    return mx.array(rows, dtype=mx.int32), padding


def cheapest_spans(n, span_costs):
    """Split ``n`` units (in order) into contiguous ``(start, stop)`` spans of least total
    cost (dynamic programming). ``span_costs(stop)`` yields ``(start, cost)`` of the spans
    ending at ``stop``, for ``start`` from ``stop - 1`` down, and stops yielding where
    longer spans are not allowed."""
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for stop in range(1, n + 1):
        for start, cost in span_costs(stop):
            if best[start] + cost < best[stop]:
                best[stop], cut[stop] = best[start] + cost, start
    spans, stop = [], n
    while stop > 0:
        spans.append((cut[stop], stop))
        stop = cut[stop]
    return spans[::-1]


def plan_prefill_groups(lengths, overhead=None, budget=None):
    """Split rows into contiguous ``(start, stop)`` groups for prefill.

    ``lengths[b]`` is the number of real tokens row ``b`` prefills. A group runs
    left-padded to its longest row, so it costs ``rows * longest`` tokens plus a
    fixed ``overhead`` per call; this picks the split of least total cost (dynamic
    programming over the row order, which ``batch_generate`` sorts by length).
    Groups of rows with nothing to prefill cost nothing and are still returned.
    """
    overhead = GROUP_OVERHEAD_TOKENS if overhead is None else overhead
    if budget is None:
        cpu = mx.default_device() == mx.cpu
        budget = GROUP_TOKEN_BUDGET_CPU if cpu else GROUP_TOKEN_BUDGET

    def span_costs(stop):
        longest = 0
        for start in range(stop - 1, -1, -1):
            longest = max(longest, lengths[start])
            rows = stop - start
            if rows > 1 and rows * longest > budget:
                return  # adding rows only grows the group
            yield start, rows * longest + (overhead if longest else 0)

    return cheapest_spans(len(lengths), span_costs)


def plan_block_merges(blocks, slots, overhead=DECODE_GROUP_OVERHEAD_KEYS):
    """Spans ``(i, j)`` of neighbouring row blocks (``cache/row_blocks.py``) to store as
    one (``j`` exclusive) so that decode attention, one call per block, costs least: a
    call costs ``overhead`` plus its rows times the slots from the merged block's first
    to ``slots``."""
    def span_costs(stop):
        rows, first = 0, slots
        for start in range(stop - 1, -1, -1):
            if start < stop - 1 and (blocks[start].head or blocks[stop - 1].head):
                return  # a block on a shared head stays alone (a merge would copy it)
            rows += blocks[start].rows
            first = min(first, blocks[start].first)
            yield start, rows * (slots - first) + overhead

    return cheapest_spans(len(blocks), span_costs)
