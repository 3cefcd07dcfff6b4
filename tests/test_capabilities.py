"""The one table of features that do not combine (``sched/capabilities.py``): each refusal
is one line naming the features as the caller wrote them, through the Python API, the
generate command line and the server's flags, before any work."""

import argparse
import re
import subprocess
import sys

import mlx.core as mx
import pytest

import test_cli as cli
from conftest import corpus_prompts
from mlx_lm_batched import batch_generate
from mlx_lm_batched.api.speculative import speculative_generate_step
from mlx_lm_batched.cli.args import run_features
from mlx_lm_batched.sched import capabilities
from mlx_lm_batched.sched.generator import BatchGenerator


def refusal_of(*features):
    found = capabilities.conflict(set(features))
    assert found is not None, features
    return found


def raises_refusal(*features):
    found = refusal_of(*features)
    return pytest.raises(found.error, match=f"^{re.escape(found.message('python'))}$")


def test_every_entry_is_one_line_naming_its_features_on_every_surface():
    assert len(capabilities.CONFLICTS) >= 7
    for c in capabilities.CONFLICTS:
        assert capabilities.conflict(c.features) is c
        for surface in capabilities.SURFACES:
            text = c.message(surface)
            assert "\n" not in text and "{" not in text
            for f in c.features:
                names = capabilities.NAMES[f]
                assert names.get(surface, names["python"]) in text, (surface, text)
    # Features that combine are not refused; a feature alone never is.
    assert capabilities.conflict({"speculative", "prompt_lookup", "adapters"}) is None
    assert all(capabilities.conflict({f}) is None for f in capabilities.NAMES)
    with pytest.raises(ValueError, match="unknown feature"):
        capabilities.conflict({"speculative", "telepathy"})
    with pytest.raises(ValueError, match="surface must be one of"):
        capabilities.CONFLICTS[0].message("grpc")


def test_python_api_refusals(float_models):
    model, tok = float_models["smollm2"]
    prompts = corpus_prompts(tok, [6, 9])
    with raises_refusal("speculative", "kv_bits"):
        BatchGenerator(model, prompt_lookup=True, kv_bits=4)
    with raises_refusal("draft_model", "prompt_lookup"):
        BatchGenerator(model, draft_model=model, prompt_lookup=True)
    with raises_refusal("speculative", "kv_bits"):
        batch_generate(model, tok, prompts, prompt_lookup=True, kv_bits=4, max_tokens=2)
    with raises_refusal("draft_model", "prompt_lookup"):
        batch_generate(model, tok, prompts, draft_model=model, prompt_lookup=True, max_tokens=2)
    bias = lambda tokens, logits: logits  # noqa: E731
    with raises_refusal("speculative", "logits_processors"):
        batch_generate(model, tok, prompts, prompt_lookup=True, logits_processors=[bias],
                       max_tokens=2)
    with raises_refusal("speculative", "logits_processors"):
        batch_generate(model, tok, prompts, prompt_lookup=True, max_tokens=2,
                       response_format={"type": "json_object"})
    gen = BatchGenerator(model, prompt_lookup=True)
    with raises_refusal("speculative", "logits_processors"):
        gen.insert(prompts, logits_processors=[[], [bias]])
    assert gen.next() == ([], [])  # nothing was queued
    with raises_refusal("speculative", "logits_processors"):
        BatchGenerator(model, prompt_lookup=True, logits_processors=[bias]).insert(prompts)
    one = mx.array(prompts[0])
    with raises_refusal("speculative", "kv_bits"):
        list(speculative_generate_step(one, model, prompt_lookup=True, kv_bits=4))
    with raises_refusal("speculative", "logits_processors"):
        list(speculative_generate_step(one, model, prompt_lookup=True, logits_processors=[bias]))
    # What combines still runs: prompt lookup with per-row sampling and plain KV caches.
    out = batch_generate(model, tok, prompts, prompt_lookup=True, max_tokens=3)
    assert all(r in ("length", "stop") for r in out.finish_reasons)


def test_generate_command_line_refusals():
    base = ["--prompt", "hi", "--max-tokens", 2, "--no-progress"]
    for flags, features in ((["--prompt-lookup", "--kv-bits", 4], ("speculative", "kv_bits")),
                            (["--draft-model", "x", "--prompt-lookup"],
                             ("draft_model", "prompt_lookup"))):
        proc = cli.run_cli(*base, *flags, timeout=300)
        cli.assert_one_line_error(proc, refusal_of(*features).message("cli"), code=2)
    # A distributed run's group is known after joining it: the same table decides.
    args = argparse.Namespace(draft_model="draft", prompt_lookup=False, kv_bits=None)
    assert capabilities.refusal(run_features(args, group=object()), "cli") == \
        "--draft-model cannot be combined with --distributed yet"
    assert capabilities.refusal(run_features(args), "cli") is None


def test_server_flag_refusals():
    for flags, features in ((["--prompt-lookup", "--kv-bits", "4"], ("speculative", "kv_bits")),
                            (["--draft-model", "x", "--prompt-lookup"],
                             ("draft_model", "prompt_lookup"))):
        proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.server", "--port", "1",
                               *flags], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and errors[0].endswith(refusal_of(*features).message("cli")), \
            proc.stderr


def test_server_engine_refuses_per_request(float_models):
    """A request's features against how the engine serves: the HTTP refusal (400 naming
    the request's field) comes from the same table."""
    from types import SimpleNamespace

    from mlx_lm_batched.server.engine import Engine
    from mlx_lm_batched.server.errors import APIError
    from mlx_lm_batched.server.events import EngineConfig

    class TensorParallel(Engine):  # what DistributedEngine declares, without a group
        serving_features = frozenset({"distributed_serving"})

    model, tok = float_models["smollm2"]
    plain = SimpleNamespace(logit_bias=None, repetition_penalty=None, presence_penalty=None,
                            frequency_penalty=None, min_tokens=0, constraint=None)
    biased = SimpleNamespace(**{**vars(plain), "logit_bias": {5: 2.0}})
    cases = ((TensorParallel(model, tok), plain, True, ("prompt_scoring", "distributed_serving")),
             (Engine(model, tok, EngineConfig(prompt_lookup=True)), biased, False,
              ("speculative", "logits_processors")))
    for engine, params, score, features in cases:
        found = refusal_of(*features)
        with pytest.raises(APIError) as e:
            engine._check_features(params, score)
        assert (e.value.status, e.value.message, e.value.param, e.value.code) == \
            (400, found.message("http") + ".", found.param, found.code)
    assert found.message("http").startswith("logit_bias and the penalties cannot be combined "
                                            "with this server's speculative decoding")
    Engine(model, tok)._check_features(biased, True)  # a plain engine combines both
    TensorParallel(model, tok)._check_features(biased, False)
