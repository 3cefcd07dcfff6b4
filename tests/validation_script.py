"""Bad inputs that used to kill the interpreter, run in a child process by
``test_validation.py`` (a segfault there fails the tests instead of pytest).

Usage: ``python validation_script.py MODEL_DIR``; prints one JSON object mapping
each case to ``{"error": type, "message": ..., "warnings": [...], "result": ...}``.
"""

import json
import sys
import time
import warnings

import mlx_lm_batched  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx

from mlx_lm_batched import batch_generate, generate_step, load, stream_generate, generate
from mlx_lm_batched.sample_utils import make_logits_processors


def run(fn):
    out = {"error": None, "message": None, "warnings": [], "result": None}
    tic = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out["result"] = fn()
        except Exception as e:  # recorded, asserted on by the test
            out["error"], out["message"] = type(e).__name__, str(e)
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    out["seconds"] = time.perf_counter() - tic
    return out


def main(model_dir):
    model, tokenizer = load(model_dir)
    vocab = model.args.vocab_size
    eos = tokenizer.eos_token_id
    stop_now = make_logits_processors({eos: 1e4})  # first token is EOS: a quick full run
    prompt = tokenizer.encode("The lighthouse keeper")

    def first_tokens(gen, n=3):
        return [r.token for _, r in zip(range(n), gen)]

    cases = {
        "generate_id_past_vocab": lambda: generate(
            model, tokenizer, prompt + [vocab], max_tokens=2),
        "generate_id_negative": lambda: generate(model, tokenizer, [-3] + prompt, max_tokens=2),
        "step_id_past_vocab": lambda: next(generate_step(
            mx.array([prompt, prompt[:-1] + [vocab + 5]]), model, max_tokens=2)),
        "batch_id_past_vocab": lambda: batch_generate(
            model, tokenizer, ["fine", prompt + [10**9]], max_tokens=2).texts,
        "logit_bias_past_vocab": lambda: generate(
            model, tokenizer, prompt, max_tokens=2,
            logits_processors=make_logits_processors({vocab: 5.0})),
        "logit_bias_huge_id": lambda: make_logits_processors({2**40: 1.0}),
        "generate_huge_max_tokens": lambda: generate(
            model, tokenizer, prompt, max_tokens=10**9, logits_processors=stop_now),
        "stream_huge_max_tokens": lambda: [len(prompt), first_tokens(
            stream_generate(model, tokenizer, prompt, max_tokens=10**9))],
        "batch_huge_max_tokens": lambda: batch_generate(
            model, tokenizer, ["a", "The sea"], max_tokens=10**9, logits_processors=stop_now,
            return_token_ids=True).finish_reasons,
    }
    results = {name: run(fn) for name, fn in cases.items()}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
