"""The generation API rejects bad input before any work, with one clear line.

Inputs that used to kill the interpreter (ids past the vocabulary, a logit bias
past it, ``max_tokens=10**9``) run in a child process (``validation_script.py``),
so a segfault fails these tests instead of pytest. The rest run in-process on
the real SmolLM2.
"""

import json
import os
import subprocess
import sys
import warnings

import mlx.core as mx
import pytest

from conftest import corpus_prompts
from mlx_lm_batched import batch_generate, generate_step, stream_batch_generate, generate, stream_generate
from mlx_lm_batched.api.validation import ContextLengthWarning

SCRIPT = os.path.join(os.path.dirname(__file__), "validation_script.py")


@pytest.fixture(scope="module")
def child(float_dirs):
    """Results of the crash-prone cases, run once in a child process."""
    proc = subprocess.run([sys.executable, SCRIPT, str(float_dirs["smollm2"])],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_error(result, kind, *words):
    assert result["error"] == kind, result
    assert "\n" not in result["message"]
    for w in words:
        assert w in result["message"], (w, result["message"])


def test_prompt_ids_past_the_vocabulary_raise_naming_the_prompt(child):
    assert_error(child["generate_id_past_vocab"], "ValueError", "49152", "[0, 49152)")
    assert_error(child["generate_id_negative"], "ValueError", "-3")
    assert_error(child["step_id_past_vocab"], "ValueError", "prompt row 1", "49157")
    assert_error(child["batch_id_past_vocab"], "ValueError", "prompt 1", str(10**9))


def test_logit_bias_past_the_vocabulary_raises(child):
    assert_error(child["logit_bias_past_vocab"], "ValueError", "logit_bias", "49152")
    assert_error(child["logit_bias_huge_id"], "ValueError", "logit_bias token id")


def test_huge_max_tokens_is_cut_to_the_context_with_one_warning(child):
    for name in ("generate_huge_max_tokens", "stream_huge_max_tokens", "batch_huge_max_tokens"):
        r = child[name]
        assert r["error"] is None, (name, r)
        assert r["seconds"] < 60, (name, r["seconds"])
        context = [w for w in r["warnings"] if w.startswith("ContextLengthWarning")]
        assert len(context) == 1 and "8192" in context[0], (name, r["warnings"])
    stream = child["stream_huge_max_tokens"]
    prompt_len, tokens = stream["result"]
    assert f"max_tokens=1000000000 cut to {8192 - prompt_len}:" in stream["warnings"][0]
    assert len(tokens) == 3
    assert child["batch_huge_max_tokens"]["result"] == ["stop", "stop"]


def _small_context(monkeypatch, model, n):
    monkeypatch.setattr(model.args, "max_position_embeddings", n)


def test_max_tokens_past_the_context_is_cut_exactly(float_models, monkeypatch):
    model, tokenizer = float_models["smollm2"]
    prompts = corpus_prompts(tokenizer, (20, 30))
    free = batch_generate(model, tokenizer, prompts, max_tokens=12, return_token_ids=True)
    _small_context(monkeypatch, model, 36)
    with pytest.warns(ContextLengthWarning, match=r"for 1 prompt\(s\): 1"):
        out = batch_generate(model, tokenizer, prompts, max_tokens=12, return_token_ids=True)
    # 36 - 20 = 16 >= 12 keeps row 0 whole; 36 - 30 = 6 cuts row 1. Same tokens up to there.
    assert out.token_ids[0] == free.token_ids[0]
    assert out.token_ids[1] == free.token_ids[1][:6]
    with pytest.warns(ContextLengthWarning, match="cut to 6"):
        tokens = [r.token for r in stream_generate(model, tokenizer, prompts[1], max_tokens=50)]
    body = [t for t in tokens if t != tokenizer.eos_token_id]
    assert body == free.token_ids[1][:6][:len(body)] and len(tokens) <= 6
    # max_tokens=-1 keeps generating, but says so when it crosses the context.
    with pytest.warns(ContextLengthWarning, match="passed the model's context"):
        for n, _ in enumerate(generate_step(mx.array(prompts[1]), model, max_tokens=-1)):
            if n == 8:
                break


def test_prompt_that_fills_the_context_raises(float_models, monkeypatch):
    model, tokenizer = float_models["smollm2"]
    prompts = corpus_prompts(tokenizer, (10, 30))
    _small_context(monkeypatch, model, 30)
    with pytest.raises(ValueError, match=r"prompt 1 has 30 tokens.*context .* is 30"):
        batch_generate(model, tokenizer, prompts, max_tokens=2)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate(model, tokenizer, prompts[1], max_tokens=2)


def test_max_tokens_must_be_an_int(float_models):
    model, tokenizer = float_models["smollm2"]
    for bad in (4.0, True, "8", None):
        with pytest.raises(TypeError, match="max_tokens"):
            generate(model, tokenizer, "Hi", max_tokens=bad)
        with pytest.raises(TypeError, match="max_tokens"):
            batch_generate(model, tokenizer, ["Hi"], max_tokens=bad)
    with pytest.raises(ValueError, match="max_tokens"):
        next(generate_step(mx.array([1, 2]), model, max_tokens=-2))
    # 0 prefills and yields nothing, as in mlx-lm; stream_generate refuses it, as mlx-lm's.
    assert list(generate_step(mx.array([1, 2]), model, max_tokens=0)) == []
    with pytest.raises(ValueError, match="max_tokens"):
        generate(model, tokenizer, "Hi", max_tokens=0)
    with pytest.raises(ValueError, match="max_tokens has 1 entries for 2 prompts"):
        batch_generate(model, tokenizer, ["a", "b"], max_tokens=[3])
    with pytest.raises(ValueError, match=r"max_tokens\[1\]"):
        batch_generate(model, tokenizer, ["a", "b"], max_tokens=[3, 0])


def test_left_padding_must_fit_each_row(float_models):
    model, tokenizer = float_models["smollm2"]
    rows = mx.array(corpus_prompts(tokenizer, (6, 6)))
    cases = [([-1, 0], ValueError, r"left_padding\[0\].*\[0, 5\]"),
             ([0, 6], ValueError, r"left_padding\[1\]"),  # an all-padding row
             ([0], ValueError, "1 entries for 2"),
             ([0, 1.0], TypeError, r"left_padding\[1\] must be an int"),
             (3, TypeError, "left_padding must be a list")]
    for padding, kind, message in cases:
        with pytest.raises(kind, match=message):
            next(generate_step(rows, model, max_tokens=2, left_padding=padding))
    # A valid padding still generates (and as the unpadded prompt would).
    alone = next(generate_step(rows[1, 2:], model, max_tokens=1))[0]
    tokens, _ = next(generate_step(rows, model, max_tokens=1, left_padding=[0, 2]))
    assert int(tokens[1]) == alone


def test_batch_prompts_are_checked_before_any_work(float_models):
    model, tokenizer = float_models["smollm2"]
    calls = []

    def sampler(logprobs):  # records whether any row was computed
        calls.append(1)
        return mx.argmax(logprobs, axis=-1)

    # The bad prompt sorts last by length: a lazy check would have run row 0 first.
    bad = [["fine", [1, 2, 3, 4, 5, 6, 7, 8, -1]], ["ok", []], ["ok", [1, 2.5]], ["ok", None],
           ["ok", [1, "2"]]]
    for prompts in bad:
        with pytest.raises((ValueError, TypeError), match="prompt 1"):
            batch_generate(model, tokenizer, prompts, max_tokens=2, sampler=sampler,
                           completion_batch_size=1)
    assert calls == []
    with pytest.raises(TypeError, match="single string"):
        batch_generate(model, tokenizer, "just one string", max_tokens=2)


def test_sizes_and_callables_are_checked(float_models):
    model, tokenizer = float_models["smollm2"]
    with pytest.raises(ValueError, match="completion_batch_size"):
        batch_generate(model, tokenizer, ["a"], max_tokens=2, completion_batch_size=0)
    with pytest.raises(ValueError, match="prefill_step_size"):
        batch_generate(model, tokenizer, ["a"], max_tokens=2, prefill_step_size=0)
    with pytest.raises(ValueError, match="prefill_step_size"):
        generate(model, tokenizer, "a", max_tokens=2, prefill_step_size=0)
    with pytest.raises(TypeError, match="max_kv_size"):
        generate(model, tokenizer, "a", max_tokens=2, max_kv_size=2.5)
    with pytest.raises(TypeError, match="sampler must be callable"):
        batch_generate(model, tokenizer, ["a"], max_tokens=2, sampler="greedy")
    with pytest.raises(TypeError, match=r"logits_processors\[0\]"):
        generate(model, tokenizer, "a", max_tokens=2, logits_processors=[5])
    with pytest.raises(TypeError, match="prompt must hold integer token ids"):
        next(generate_step(mx.array([1.0, 2.0]), model))
    with pytest.raises(ValueError, match="shape"):
        next(generate_step(mx.zeros((1, 1, 3), mx.int32), model))


def test_unknown_and_unsupported_keywords(float_models):
    model, tokenizer = float_models["smollm2"]
    with pytest.raises(TypeError, match="samplr"):
        batch_generate(model, tokenizer, ["a"], max_tokens=2, samplr=None)
    with pytest.raises(TypeError, match="temperature"):
        next(stream_batch_generate(model, tokenizer, ["a"], max_tokens=2, temperature=0.5))
    with pytest.raises(ValueError, match="kv_group_size must be one of"):
        generate(model, tokenizer, "a", max_tokens=2, kv_bits=4, kv_group_size=33)
    # mlx-lm's stream= (the stream the generator runs on) works; a non-stream is refused.
    assert batch_generate(model, tokenizer, ["a"], max_tokens=2, stream=mx.cpu).texts[0]
    with pytest.raises(TypeError, match="stream"):
        batch_generate(model, tokenizer, ["a"], max_tokens=2, stream="cpu")
    # mlx-lm's prefill_batch_size is accepted (and checked).
    out = batch_generate(model, tokenizer, ["a", "b"], max_tokens=2, prefill_batch_size=1)
    assert len(out.texts) == 2
    with pytest.raises(ValueError, match="prefill_batch_size"):
        batch_generate(model, tokenizer, ["a"], max_tokens=2, prefill_batch_size=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a normal call warns about nothing
        assert generate(model, tokenizer, "The sea", max_tokens=3)
