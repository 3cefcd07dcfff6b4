"""Prompt log-probabilities (``/v1/completions`` with ``echo``, what lm-evaluation-harness's
``local-completions`` sends for loglikelihood) and vLLM's output fields
``include_stop_str_in_output`` / ``skip_special_tokens``, on the real SmolLM2 through the
official ``openai`` client.

A prompt's scores come from its own prefill logits: the same as a plain full forward of
the model, and the same next to other rows of other lengths, with any prefill chunking.
"""

import concurrent.futures as futures

import mlx.core as mx
import pytest

from conftest import corpus_prompts
from mlx_lm_batched.sched.generator import BatchGenerator
from server_harness import ServerProcess

MODEL = None  # the served model's id (its directory), set by the server fixture
PROMPTS = ["The capital of France is Paris.", "One, two, three, four, five",
           "def add(a, b):\n    return a + b"]


@pytest.fixture(scope="module")
def server(float_dirs):
    global MODEL
    MODEL = str(float_dirs["smollm2"])
    srv = ServerProcess(float_dirs["smollm2"], "--max-batch", 8, "--prefill-step-size", 7)
    yield srv
    srv.stop()


def full_forward_scores(model, tokens):
    """Each token's log-probability after the first, from one unbatched forward."""
    logits = model(mx.array([tokens])).astype(mx.float32)[0]
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return [lp[i, tokens[i + 1]].item() for i in range(len(tokens) - 1)]


# float32 sums in another order (BLAS kernels by shape, attention over other key
# lengths when the chunks differ): the README's bound for a row vs alone is 5.5e-5.
TOL = 1e-4


def close(a, b):
    """Two lists of log-probabilities (None allowed where both have it) within TOL."""
    return len(a) == len(b) and all((x is None and y is None) or abs(x - y) < TOL
                                    for x, y in zip(a, b))


def generator_scores(model, prompts, top, step):
    """The ``prompt_logprobs`` a BatchGenerator reports for ``prompts`` in one batch."""
    gen = BatchGenerator(model, prefill_step_size=step)
    uids = gen.insert(prompts, max_tokens=[1] * len(prompts), prompt_logprobs=top)
    out = {}
    while len(out) < sum(t is not None for t in top):
        for p in gen.next()[0]:
            if p.prompt_logprobs is not None:
                out[p.uid] = p.prompt_logprobs
    return [out.get(u) for u in uids]


def test_prompt_scores_batch_invariant(float_models, row_invariant_matmuls):
    model, tok = float_models["smollm2"]
    # Every matmul through the row-invariant kernel: the BLAS may round a row differently
    # at another number of rows (MKL on an AVX2 AMD EPYC does), which the bit-for-bit
    # check below is not about.
    prompts = corpus_prompts(tok, [9, 39, 14])
    alone = generator_scores(model, [prompts[1]], [3], step=2048)[0]
    assert len(alone) == len(prompts[1]) - 1
    ref = full_forward_scores(model, prompts[1])
    assert close([a for a, _ in alone], ref)
    # The top alternatives are sorted and hold the most likely token.
    for lp, top in alone:
        assert len(top) == 3 and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        assert lp <= top[0][1] + 1e-6
    for step in (2048, 5):  # one call, and chunks that cut every row
        batch = generator_scores(model, prompts, [0, 3, None], step=step)
        assert close([a for a, _ in batch[1]], [a for a, _ in alone]), step
        assert [[i for i, _ in t] for _, t in batch[1]] == [[i for i, _ in t] for _, t in alone]
        if step == 2048:  # the same calls for this row: the same sums, bit for bit
            assert batch[1] == alone
        assert batch[2] is None and len(batch[0]) == 8 and all(t == [] for _, t in batch[0])


def test_echo_logprobs_equal_solo_and_full_forward(client, float_models):
    model, tok = float_models["smollm2"]

    def score(prompt):
        r = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=2,
                                      max_tokens=0)
        return r

    solo = [score(p) for p in PROMPTS]
    with futures.ThreadPoolExecutor(3) as pool:  # concurrent: rows of one batch
        together = list(pool.map(score, PROMPTS))
    many = score(PROMPTS)  # one request, three prompts
    for i, (p, r) in enumerate(zip(PROMPTS, solo)):
        c = r.choices[0]
        ids = tok.encode(p)
        assert c.text == p and c.finish_reason == "length"
        assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
        lp = c.logprobs
        assert lp.tokens == [tok.decode([t]) for t in ids]
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        ref = full_forward_scores(model, ids)
        assert close(lp.token_logprobs[1:], ref)
        assert all(len(t) <= 2 for t in lp.top_logprobs[1:])
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(len(ids))]
        assert close(together[i].choices[0].logprobs.token_logprobs, lp.token_logprobs)
        assert close(many.choices[i].logprobs.token_logprobs, lp.token_logprobs)
        assert many.choices[i].text == p
    # Token-id prompts (lm-eval's tokenized requests) echo their decoded text.
    ids = tok.encode(PROMPTS[2])
    r = client.completions.create(model=MODEL, prompt=ids, echo=True, logprobs=0, max_tokens=0)
    assert r.choices[0].text == tok.decode(ids)
    assert close(r.choices[0].logprobs.token_logprobs, solo[2].choices[0].logprobs.token_logprobs)


def test_echo_with_completion_as_lm_eval_sends_it(client):
    # lm-evaluation-harness local-completions: echo, logprobs 1, max_tokens 1, temperature 0.
    p = PROMPTS[1]
    r = client.completions.create(model=MODEL, prompt=p, echo=True, logprobs=1, max_tokens=1,
                                  temperature=0)
    plain = client.completions.create(model=MODEL, prompt=p, logprobs=1, max_tokens=1)
    c, n = r.choices[0], r.usage.prompt_tokens
    assert c.text == p + plain.choices[0].text
    assert len(c.logprobs.tokens) == n + 1
    assert close(c.logprobs.token_logprobs[n:], plain.choices[0].logprobs.token_logprobs)
    # Echo without logprobs, streamed: the prompt first, then the completion.
    stream = client.completions.create(model=MODEL, prompt=p, echo=True, max_tokens=4, stream=True)
    text = "".join(ch.choices[0].text for ch in stream)
    whole = client.completions.create(model=MODEL, prompt=p, echo=True, max_tokens=4)
    assert text == whole.choices[0].text and text.startswith(p) and len(text) > len(p)


def test_max_tokens_zero_needs_echo(server):
    code, body, _ = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 0})
    assert code == 400 and body["error"]["param"] == "max_tokens", body


def test_include_stop_str_in_output(client, float_dirs):
    base = dict(model=MODEL, prompt="One, two, three,", max_tokens=12)
    free = client.completions.create(**base).choices[0].text
    stop = free.strip().split()[1][:3]  # a piece of the second word of the free run
    cut = client.completions.create(**base, stop=[stop]).choices[0]
    kept = client.completions.create(**base, stop=[stop],
                                     extra_body={"include_stop_str_in_output": True}).choices[0]
    assert cut.finish_reason == kept.finish_reason == "stop"
    assert cut.text == free[: free.index(stop)] and kept.text == cut.text + stop
    streamed = client.completions.create(**base, stop=[stop], stream=True,
                                         extra_body={"include_stop_str_in_output": True})
    assert "".join(ch.choices[0].text for ch in streamed) == kept.text
    # A stop token's text is kept too.
    first = client.completions.create(**{**base, "max_tokens": 1}, logprobs=0).choices[0]
    tid = _token_id(float_dirs, first.logprobs.tokens[0])
    r = client.completions.create(**base, extra_body={"stop_token_ids": [tid],
                                                      "include_stop_str_in_output": True})
    assert r.choices[0].text == first.text and r.choices[0].finish_reason == "stop"


def _token_id(float_dirs, text):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(float_dirs["smollm2"] / "tokenizer.json"))
    (tid,) = tok.encode(text, add_special_tokens=False)
    return tid


def test_skip_special_tokens(client):
    # <|im_start|> (id 1) is special and does not end a row: force it with logit_bias.
    base = dict(model=MODEL, max_tokens=3, logit_bias={"1": 100})
    r = client.completions.create(**base, prompt="Hi")
    assert r.choices[0].text == "<|im_start|>" * 3  # default: kept, as mlx-lm
    r = client.completions.create(**base, prompt="Hi", extra_body={"skip_special_tokens": False})
    assert r.choices[0].text == "<|im_start|>" * 3
    r = client.completions.create(**base, prompt="Hi", extra_body={"skip_special_tokens": True})
    assert r.choices[0].text == "" and r.usage.completion_tokens == 3
    chat = client.chat.completions.create(**base, messages=[{"role": "user", "content": "Hi"}],
                                          stream=True, extra_body={"skip_special_tokens": True})
    assert "".join(ch.choices[0].delta.content or "" for ch in chat if ch.choices) == ""
