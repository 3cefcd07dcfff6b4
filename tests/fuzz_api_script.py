"""Seeded garbage arguments thrown at the public API, in a child process of
``test_validation_fuzz.py`` (a signal death there fails the test).

Usage: ``python fuzz_api_script.py MODEL_DIR SEED CASES``. Each case calls one of
``batch_generate``, ``generate_step``, ``make_sampler`` or
``make_logits_processors`` (whose results also run a short generation) with
arguments drawn from pools of valid and invalid values. Prints one JSON object:
outcome counts per exception type and the cases that raised anything else.
"""

import json
import random
import sys
import traceback

import mlx_lm_batched  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
import numpy as np

from mlx_lm_batched import batch_generate, generate_step, load
from mlx_lm_batched.sample_utils import make_logits_processors, make_sampler

DOCUMENTED = (ValueError, TypeError, FileNotFoundError, NotImplementedError)
VOCAB = 49152
NAN, INF = float("nan"), float("inf")

INTS = [-5, -1, 0, 1, 2, 3, 7, 10**9, 2**63, True, 2.5, NAN, "3", None, [], [1, 2],
        mx.array(3), np.int64(2), {"a": 1}]
REALS = [-1.0, 0.0, 0.3, 0.9, 1.0, 1.5, 2, NAN, INF, -INF, "hot", None, [0.5, 0.7], [],
         [0.1, -0.1], mx.array([0.5, 0.2]), mx.array([[0.5]]), np.float32(0.7), True, 1e300]
IDS = [0, 1, 2, 5, 200, VOCAB - 1, VOCAB, VOCAB + 3, 10**9, 2**40, -1, -(2**33), 2.0, "7", None]


def prompt_pool():
    ok = [1, 2, 3, 4]
    return [
        [ok], [ok, ok[:2]], ["The sea", "x"], [], [[]], "a string", ["ok", ""], [[1, VOCAB]],
        [[-1, 3]], [[1.5, 2]], [None], 5, None, [["a", "b"]], mx.array([ok, ok]),
        [ok, [VOCAB + 10]], [[2**63]], [b"bytes"], [ok * 8, ok], (ok,), [np.array(ok)],
        [mx.array([1.0, 2.0])], [{"a": 1}],
    ]


def array_pool():
    return [
        mx.array([1, 2, 3]), mx.array([[1, 2, 3], [4, 5, 6]]), mx.array([1.0, 2.0]),
        mx.array([VOCAB]), mx.array([[-4, 1]]), mx.zeros((0,), mx.int32),
        mx.zeros((2, 0), mx.int32), mx.zeros((1, 1, 2), mx.int32), [1, 2, 3], [[1, 2], [3]],
        "text", None, 7, mx.array([1, 2], dtype=mx.uint32), mx.array([True, False]),
        np.array([[5, 6, 7]]),
    ]


def pick(rng, pool):
    return pool[rng.randrange(len(pool))]


def sampler_kwargs(rng):
    names = ["temp", "top_p", "min_p", "top_k", "min_tokens_to_keep", "xtc_probability",
             "xtc_threshold", "xtc_special_tokens"]
    kw = {}
    for name in rng.sample(names, rng.randrange(1, 4)):
        pool = {"top_k": INTS, "min_tokens_to_keep": INTS,
                "xtc_special_tokens": [None, [], [VOCAB + 1], [-1], 5, "ab", [2, 3], IDS]}
        kw[name] = pick(rng, pool.get(name, REALS))
    return kw


def processor_kwargs(rng):
    kw = {}
    for name in rng.sample(["logit_bias", "repetition_penalty", "presence_penalty",
                            "frequency_penalty", "repetition_context_size",
                            "presence_context_size", "frequency_context_size"],
                           rng.randrange(1, 3)):
        if name == "logit_bias":
            kw[name] = rng.choice([None, {}, [1, 2], "x", {pick(rng, IDS): pick(rng, REALS)},
                                   {3: 1.0, pick(rng, IDS): 2.0}])
        else:
            kw[name] = pick(rng, INTS if name.endswith("size") else REALS)
    return kw


def make_case(rng, model, tokenizer):
    """One (description, call) pair."""
    kind = rng.choice(["batch", "step", "sampler", "processors"])
    if kind == "batch":
        kw = {"max_tokens": pick(rng, INTS + [[2, 3], [1]])}
        for name in rng.sample(["completion_batch_size", "prefill_step_size", "max_kv_size",
                                "sampler", "logits_processors", "verbose", "samplr",
                                "return_logprobs", "prefill_batch_size"], rng.randrange(0, 3)):
            pool = {"sampler": [None, "greedy", 5, make_sampler(temp=0.5)],
                    "logits_processors": [None, [], 5, [5], make_logits_processors(None, 1.1)]}
            kw[name] = pick(rng, pool.get(name, INTS))
        prompts = pick(rng, prompt_pool())
        return f"batch_generate(prompts={prompts!r:.80}, {kw!r:.200})", \
            lambda: batch_generate(model, tokenizer, prompts, **kw).texts
    if kind == "step":
        prompt = pick(rng, array_pool())
        kw = {"max_tokens": pick(rng, INTS)}
        for name in rng.sample(["left_padding", "prefill_step_size", "max_kv_size", "kv_bits",
                                "kv_group_size", "quantized_kv_start"], rng.randrange(0, 3)):
            pool = {"left_padding": [[0], [0, 1], [1, 0], [-1, 0], [3, 0], [0, 0, 0], 1,
                                     [0.0, 1], mx.array([1, 0]), None, [True, 0]]}
            kw[name] = pick(rng, pool.get(name, INTS))

        def run():
            out = []
            for n, step in enumerate(generate_step(prompt, model, **kw)):
                out.append(step)
                if n == 5:  # max_tokens=-1 never ends on its own
                    break
            return len(out)

        return f"generate_step({prompt!r:.80}, {kw!r:.200})", run
    if kind == "sampler":
        kw = sampler_kwargs(rng)

        def run():
            sampler = make_sampler(**kw)
            return batch_generate(model, tokenizer, ["The sea", "A"], max_tokens=2,
                                  sampler=sampler).texts

        return f"make_sampler({kw!r:.200})", run
    kw = processor_kwargs(rng)

    def run():
        processors = make_logits_processors(**kw)
        return batch_generate(model, tokenizer, ["The sea", "A"], max_tokens=2,
                              logits_processors=processors).texts

    return f"make_logits_processors({kw!r:.200})", run


def main(model_dir, seed, cases):
    model, tokenizer = load(model_dir)
    # A short context: any max_tokens accepted (10**9 included) is cut to a few steps.
    model.args.max_position_embeddings = 24
    rng = random.Random(seed)
    counts, unexpected = {}, []
    for _ in range(cases):
        text, call = make_case(rng, model, tokenizer)
        try:
            call()
            outcome = "ok"
        except DOCUMENTED as e:
            outcome = type(e).__name__
            if "\n" in str(e):
                unexpected.append(f"{text}: multi-line {outcome}: {e!r:.300}")
        except Exception as e:  # the finding this script exists for
            outcome = type(e).__name__
            unexpected.append(f"{text}: {outcome}: {e!r:.300} "
                              f"{traceback.format_exc().splitlines()[-3]}")
        counts[outcome] = counts.get(outcome, 0) + 1
    print(json.dumps({"counts": counts, "unexpected": unexpected}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
