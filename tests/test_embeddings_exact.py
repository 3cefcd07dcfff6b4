"""``engine/embeddings.embed`` on real SmolLM2 (float32): a text's vector is the same bits
in any batch (other lengths, other counts, other order, evaluated in one go or in
several) as the text embedded alone, for each pooling; a text longer than a chunk goes
through the model's caches chunk by chunk and still equals transformers' hidden states."""

import numpy as np
import pytest
import torch
from transformers import AutoModel

from conftest import corpus_prompts
from mlx_lm_batched.engine.embeddings import Pooling, embed

HF_TOL = 1e-5  # against transformers in float32 (as tests/test_server_embeddings.py)
LENGTHS = (1, 9, 40, 71)


@pytest.fixture(scope="module")
def smol(float_models):
    return float_models["smollm2"]


@pytest.fixture(scope="module")
def texts(smol):
    return corpus_prompts(smol[1], LENGTHS)


def alone(model, prompt, pooling, **kw):
    return embed(model, [prompt], pooling, **kw)[0]


def check_rows(model, texts, pooling, batches, max_tokens=(8192,)):
    solo = [alone(model, t, pooling) for t in texts]
    for rows in batches:
        for limit in max_tokens:
            got = embed(model, [texts[i] for i in rows], pooling, max_tokens=limit)
            for i, vector in zip(rows, got):
                assert vector.dtype == np.float32 and vector.shape == solo[i].shape
                assert np.array_equal(vector, solo[i]), (pooling, rows, limit, i)
    # The rows really differ (the checks above compare different vectors).
    assert not np.array_equal(solo[0], solo[1])


def test_a_row_is_the_text_alone_bit_for_bit(smol, texts):
    batches = [list(range(len(texts))),  # every length at once
               list(range(len(texts)))[::-1],  # another order
               [3, 0, 3, 2, 1]]  # repeats among other rows
    # max_tokens: evaluated in one go, or a few rows at a time.
    check_rows(smol[0], texts, Pooling("mean"), batches, max_tokens=(8192, 30))


@pytest.mark.parametrize("pooling", [Pooling("last"), Pooling("max", normalize=False),
                                     Pooling("cls", dimensions=64)])
def test_every_pooling_is_batch_invariant(smol, texts, pooling):
    check_rows(smol[0], texts, pooling, [[2, 0, 3, 1, 0]])


def test_long_text_in_chunks_equals_transformers(smol, float_dirs, texts):
    model = smol[0]
    hf = AutoModel.from_pretrained(str(float_dirs["smollm2"]), dtype=torch.float32).eval()
    long_text, short = texts[-1], texts[1]
    pooling = Pooling("mean")
    # chunk=16: the 71-token text goes in 5 calls through the caches, the short one in one.
    chunked = embed(model, [short, long_text], pooling, chunk=16)
    assert np.array_equal(chunked[0], alone(model, short, pooling, chunk=16))
    assert np.array_equal(chunked[1], alone(model, long_text, pooling, chunk=16))
    whole = alone(model, long_text, pooling)
    assert not np.array_equal(chunked[1], whole)  # other calls: other sums
    with torch.no_grad():
        h = hf(torch.tensor([long_text])).last_hidden_state[0].numpy().mean(axis=0)
    expected = h / np.linalg.norm(h)
    for got in (chunked[1], whole):
        assert np.abs(got - expected).max() <= HF_TOL
