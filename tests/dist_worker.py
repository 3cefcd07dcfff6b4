"""One rank of a distributed test (tests/test_distributed_*.py), run by ``mlx.launch``.

``python tests/dist_worker.py MODE MODEL_DIR RESULT_JSON``. Every rank loads the model
sharded; rank 0 also runs the unsharded model as the oracle, compares, and writes
``RESULT_JSON`` (the checks that passed, or the first failure). Modes:

- ``tensor``: padded batch of mixed lengths (logits within 1e-4, greedy tokens equal),
  then rows joining a running ``BatchGenerator`` (tokens and logprobs equal);
  ``tensor-quick`` (4-bit models): the first two only, logits within 5e-4;
- ``many``: ``MODEL_DIR`` holds several model directories (tiny recurrent and hybrid
  checkpoints, one launch for all; ``-q4`` names: 4-bit, logits within 5e-4): the
  ``tensor`` checks for each, and the shapes of its
  state caches sharded (rank 0) and whole, per model in ``RESULT_JSON``;
- ``pipeline``: the model split by layers (``sharded_load(pipeline_group=...)``): the
  ``tensor`` checks plus greedy tokens on rotating caches that wrap around; the result
  also names every rank's layer range and rank 0's parameter bytes against the whole;
  ``pipeline-quick``: padded logits and greedy tokens only (within 1e-4 too);
- ``plan``: ``MODEL_DIR`` is a JSON file of ``[name, mode, model directory]`` entries
  (modes ``tensor``, ``tensor-quick``, ``many``, ``pipeline``, ``pipeline-quick``), run one
  after the other in one launch; ``RESULT_JSON`` maps each name to that mode's result;
- ``die``: rank 1 dies after loading (``os._exit``); ``stall``: rank 1 stops taking part;
  ``pipeline-die``: ``die`` with the model split by layers.
  Rank 0's guarded steps must then exit with a clear error, not hang.
"""

import json
import os
import sys
import time
import traceback
from pathlib import Path

import mlx_lm_batched  # noqa: F401  (loads the fast BLAS before mlx.core)
import mlx.core as mx
import numpy as np

from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.parallel.group import guard_collectives
from mlx_lm_batched.cache.state import StateCache
from mlx_lm_batched.sched.generator import BatchGenerator
from mlx_lm_batched.utils import load, sharded_load

ATOL = 1e-4
SCALE_TOL = 1e-5  # of a row's largest logit (see compare)
# 4-bit weights: the split sums of larger dequantized products round differently (measured:
# 1 logit in 600k off by 1.3e-4 on SmolLM2), still far below any token change.
ATOL_QUICK = 5e-4
LENGTHS = (7, 1, 12, 4)


def prompts(vocab, lengths, seed):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, min(vocab, 2000), n)] for n in lengths]


def padded_logits(model, batch):
    tokens, padding = left_pad(batch)
    logits = model(tokens, offset=mx.array([-p for p in padding]))
    return [np.array(logits[i, p:]) for i, p in enumerate(padding)]


def greedy(model, batch, n, max_kv_size=None):
    tokens, padding = left_pad(batch)
    engine = BatchEngine(model, max_kv_size=max_kv_size)
    y, _ = engine.prefill(tokens, padding)
    out = [y]
    for _ in range(n - 1):
        y, _ = engine.step(y)
        out.append(y)
    return np.array(mx.stack(out, axis=1)).tolist()


def joining(model, batch, n=4):
    """Two rows start, two join after two steps: ``{uid: [(token, logprob)...]}``."""
    gen = BatchGenerator(model, max_tokens=n)
    gen.insert(batch[:2])
    rows, steps = {}, 0
    while True:
        if steps == 2:
            gen.insert(batch[2:])
        _, responses = gen.next()
        for r in responses:
            rows.setdefault(r.uid, []).append((r.token, float(r.logprobs[r.token])))
        steps += 1
        if steps > 2 and not responses:
            return rows


def run_all(model, vocab, join=True, ring=False):
    """Everything the check computes with ``model`` (the same collectives on every rank);
    ``join=False`` skips the BatchGenerator part (slow quantized CPU matmuls); ``ring``
    adds greedy tokens on rotating caches of 9 slots (decode steps wrap around)."""
    batch, gen = prompts(vocab, LENGTHS, 1), prompts(vocab, LENGTHS, 2)
    # 5 greedy tokens: prompts of up to 12 tokens and 5 decode steps wrap the 9-slot ring.
    return (padded_logits(model, batch), greedy(model, gen, 5), joining(model, gen) if join else None,
            greedy(model, gen, 5, max_kv_size=9) if ring else None)


def compare(ours, oracle, atol=ATOL):
    for i, (a, b) in enumerate(zip(ours[0], oracle[0])):
        # Float32 rounding of the reordered sums grows with the logits' scale: Gemma 3's reach
        # 23, and its tensor-parallel logits differed by up to 1.6e-4 with MKL (7e-6 of that).
        row_atol = max(atol, SCALE_TOL * float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, atol=row_atol, rtol=ATOL, err_msg=f"row {i} logits")
    assert ours[1] == oracle[1], f"greedy tokens differ: {ours[1]} vs {oracle[1]}"
    assert ours[3] == oracle[3], f"greedy tokens on rotating caches differ: {ours[3]} vs {oracle[3]}"
    ring = ["greedy tokens, rotating caches"] if oracle[3] is not None else []
    if oracle[2] is None:
        return ["padded logits", "greedy tokens"] + ring
    rows, ref_rows = ours[2], oracle[2]
    assert sorted(rows) == sorted(ref_rows) and len(rows) == 4, (rows.keys(), ref_rows.keys())
    for uid in ref_rows:
        assert [t for t, _ in rows[uid]] == [t for t, _ in ref_rows[uid]], f"row {uid} tokens"
        np.testing.assert_allclose([p for _, p in rows[uid]], [p for _, p in ref_rows[uid]],
                                   atol=ATOL, err_msg=f"row {uid} logprobs")
    return ["padded logits", "greedy tokens", "rows joining BatchGenerator"] + ring


def param_bytes(model):
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def pipeline_layers(model, group):
    """Every rank's ``[start, stop)`` of the model's blocks, as rank 0 sees them, and
    whether its caches hold only those layers."""
    s = model.stage
    mine = mx.array([s.start, s.stop, len(model.make_cache())], mx.int32)
    every = mx.distributed.all_gather(mine[None], group=group, stream=mx.cpu)
    return [[int(a), int(b), int(c)] for a, b, c in np.array(every).tolist()] + [s.n_layers]


def state_shapes(model, vocab):
    """Shapes of the ``StateCache`` arrays after a prefill of a padded batch of 2."""
    engine = BatchEngine(model)
    engine.prefill(*left_pad(prompts(vocab, (5, 2), 3)))
    return [list(a.shape) for c in engine.cache if isinstance(c, StateCache) for a in c.arrays]


def check_many(parent, rank):
    """The ``tensor`` checks on each model directory under ``parent``: rank 0's report
    ``{name: {"passed" or "failure", "states": [sharded, whole]}}``."""
    out = {}
    for directory in sorted(Path(parent).iterdir()):
        model, _ = sharded_load(str(directory))
        vocab = model.args.vocab_size
        ours, shapes = run_all(model, vocab), state_shapes(model, vocab)
        if rank:
            continue
        ref, _ = load(str(directory))
        entry = out[directory.name] = {"states": [shapes, state_shapes(ref, vocab)]}
        try:  # 4-bit conversions (names ending in -q4): the split sums round differently
            atol = ATOL_QUICK if directory.name.endswith("-q4") else ATOL
            entry["passed"] = compare(ours, run_all(ref, vocab), atol)
        except AssertionError:
            entry["failure"] = traceback.format_exc()
    return out


def check_one(mode, model_dir, group):
    """One mode on one model directory (every mode but ``many`` and ``plan``): rank 0's
    result (the other ranks' is ``{"size", "rank"}`` and, pipelined, the layers)."""
    rank = group.rank()
    pipeline = mode.startswith("pipeline")
    model, _ = sharded_load(model_dir, pipeline_group=group) if pipeline else sharded_load(model_dir)
    out = {"size": group.size(), "rank": rank}
    if pipeline:
        out["layers"] = pipeline_layers(model, group)
    if mode in ("die", "stall", "pipeline-die"):
        if rank == 1:
            if mode == "stall":
                time.sleep(600)  # alive, its sockets open, but never joins a collective
            os._exit(7)
        with guard_collectives(timeout=10) as guard:
            for _ in range(4):
                greedy(model, prompts(100, (3,), 0), 2)
                guard.tick()
        out["passed"] = ["no error after a rank died"]  # guard_collectives exits before this
    else:
        vocab = model.stage.vocab if pipeline else model.model.embed_tokens.weight.shape[0]
        join, ring = mode in ("tensor", "pipeline"), mode == "pipeline"
        ours = run_all(model, vocab, join, ring)
        if rank == 0:
            ref, _ = load(model_dir)
            if pipeline:
                out["bytes"] = [param_bytes(model), param_bytes(ref)]
            else:
                out["heads"] = [model.layers[0].self_attn.n_heads, ref.layers[0].self_attn.n_heads]
            try:
                atol = ATOL if join or pipeline else ATOL_QUICK
                out["passed"] = compare(ours, run_all(ref, vocab, join, ring), atol)
            except AssertionError:
                out["failure"] = traceback.format_exc()
    return out


def check(mode, model_dir, group):
    """Rank 0's result of ``mode`` (any but ``plan``) on ``model_dir``."""
    if mode == "many":
        return {"size": group.size(), "models": check_many(model_dir, group.rank())}
    return check_one(mode, model_dir, group)


def main():
    mode, model_dir, result = sys.argv[1:4]
    group = mx.distributed.init()
    rank = group.rank()
    if mode == "plan":
        # One launch for several checks (each process imports and joins the ring once):
        # ``{name: that check's result}`` in the plan's order, the same on every rank.
        plan = json.loads(Path(model_dir).read_text())
        out = {name: check(m, d, group) for name, m, d in plan}
    else:
        out = check(mode, model_dir, group)
    if rank == 0:
        with open(result, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
