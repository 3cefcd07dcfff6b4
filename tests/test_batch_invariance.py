"""Batch invariance (docs/architecture.md): the same prompt gives the same logits
alone, as one of 4 or 32 identical rows, and with prefill chunks of 8 or 2048 columns.

No formula of this package depends on the array size or the batch; what remains is
the platform's float32 accumulation order (BLAS kernels chosen by matrix shape, sums
over key lengths that differ with chunking). Measured on SmolLM2 and Gemma 3 in
float32 with MKL and OpenBLAS: at most 5.5e-5 in log-probabilities (README, "How
batching stays exact"); the bound below leaves room for other BLAS builds.
"""

import mlx.core as mx
import numpy as np
import pytest

from conftest import corpus_prompts
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.layers import cpu_ops

TOLERANCE = 1e-4


def logprobs_of(model, prompt, rows, chunk, max_kv_size=None, steps=3):
    """Log-probabilities ``(steps + 1, rows, V)`` of greedy decoding ``rows`` copies of
    ``prompt`` in one batch, prefilled in chunks of ``chunk`` columns."""
    engine = BatchEngine(model, prefill_step_size=chunk, max_kv_size=max_kv_size)
    engine.reserve(steps + 1)
    y, lp = engine.prefill(mx.array([prompt] * rows))
    out = [lp]
    for _ in range(steps):
        y, lp = engine.step(y)
        out.append(lp)
    return np.array(mx.stack(out))


@pytest.mark.parametrize("name,max_kv_size", [("smollm2", None), ("smollm2", 16),
                                              ("gemma3", None)])
def test_rows_and_chunks_do_not_change_a_prompts_logits(float_models, name, max_kv_size):
    model, tokenizer = float_models[name]
    prompt = corpus_prompts(tokenizer, (48,))[0]
    alone = {2048: logprobs_of(model, prompt, 1, 2048, max_kv_size)}
    cases = [(1, 8), (4, 2048), (32, 2048)] + ([(32, 8)] if max_kv_size else [])
    if max_kv_size:
        # mlx-lm's max_kv_size caches keep 4 sink tokens under a rule that depends on
        # the prefill chunking (mlx-lm's does, and results here equal mlx-lm's): rows
        # are compared with the prompt alone at the same chunking.
        alone[8] = logprobs_of(model, prompt, 1, 8, max_kv_size)
    for rows, chunk in cases:
        got = logprobs_of(model, prompt, rows, chunk, max_kv_size)
        base = alone.get(chunk, alone[2048])
        worst = float(np.abs(got - base).max())
        assert worst <= TOLERANCE, (rows, chunk, worst)
        spread = float(np.abs(got - got[:, :1]).max())  # identical rows of one batch
        assert spread <= TOLERANCE, (rows, chunk, spread)
        assert (got.argmax(-1) == base.argmax(-1)).all()


@pytest.mark.parametrize("fn", [cpu_ops.exp, cpu_ops.silu,
                                lambda x: cpu_ops.softmax(x, axis=-1)])
def test_elementwise_formulas_do_not_depend_on_the_array_size(fn):
    # One row alone, and the same row inside arrays of 4 and 64 rows (across the
    # sizes where a "fast path" used to take over): bit for bit the same values.
    with mx.stream(mx.cpu):
        x = mx.random.normal((64, 9, 2, 700), key=mx.random.key(3)) * 6
        alone = fn(x[:1])
        for rows in (4, 64):
            assert mx.array_equal(fn(x[:rows])[:1], alone).item(), rows
