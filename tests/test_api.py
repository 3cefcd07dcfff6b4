"""Drop-in behaviour: code written for mlx-lm runs unchanged with our import, and
the pieces around generation (prompt caches, streaming, hub loading) work."""

import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np
import pytest

from conftest import corpus_prompts
from mlx_lm_batched import batch_generate, generate_step, stream_batch_generate, generate
from mlx_lm_batched.models.cache import (
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
)

# Written against mlx-lm's public API; run once with each import prefix.
MLX_LM_SCRIPT = textwrap.dedent('''
    import json, sys
    from {pkg} import load, generate, stream_generate, batch_generate
    from {pkg}.sample_utils import make_sampler, make_logits_processors
    from {pkg}.models.cache import make_prompt_cache

    model, tokenizer = load(sys.argv[1])
    messages = [{{"role": "user", "content": "Name three colours."}}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    out = {{}}
    out["generate"] = generate(model, tokenizer, prompt=prompt, max_tokens=12)
    out["stream"] = "".join(r.text for r in stream_generate(model, tokenizer, prompt, max_tokens=12))
    out["processors"] = generate(
        model, tokenizer, prompt=prompt, max_tokens=12, sampler=make_sampler(temp=0.0),
        logits_processors=make_logits_processors(repetition_penalty=1.3),
    )
    cache = make_prompt_cache(model)
    first = generate(model, tokenizer, prompt=prompt, max_tokens=8, prompt_cache=cache)
    follow = tokenizer.encode(" And two more?", add_special_tokens=False)
    out["cache_turns"] = [first, generate(model, tokenizer, prompt=follow, max_tokens=8,
                                          prompt_cache=cache)]
    texts = ["The sea is", "Lighthouses guide"]
    ids = [tokenizer.encode(t) for t in texts]
    out["batch"] = batch_generate(model, tokenizer, ids, max_tokens=10).texts
    print(json.dumps(out))
''')


def run_script(pkg, model_dir):
    code = MLX_LM_SCRIPT.format(pkg=pkg)
    proc = subprocess.run([sys.executable, "-c", code, str(model_dir)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_mlx_lm_code_runs_unchanged_and_agrees(float_dirs):
    # mlx-lm runs in its own subprocess below: it is the oracle (test extra), never skipped.
    import json

    ours = json.loads(run_script("mlx_lm_batched", float_dirs["smollm2"]))
    theirs = json.loads(run_script("mlx_lm", float_dirs["smollm2"]))
    assert ours["generate"] and ours["generate"] == ours["stream"]
    # Greedy generation on the same weights: the same text as mlx-lm.
    for key in ("generate", "processors", "cache_turns", "batch"):
        assert ours[key] == theirs[key], key


def test_generate_step_batched_contract(float_models):
    model, tokenizer = float_models["smollm2"]
    prompts = corpus_prompts(tokenizer, (4, 9))
    padded = mx.array([[0] * 5 + prompts[0], prompts[1]])
    steps = list(generate_step(padded, model, max_tokens=3, left_padding=[5, 0]))
    assert len(steps) == 3
    tokens, logprobs = steps[0]
    assert tokens.shape == (2,) and logprobs.shape == (2, model.args.vocab_size)
    # A 1-D prompt keeps the single-sequence contract: (int, (V,)).
    token, lp = next(generate_step(mx.array(prompts[0]), model, max_tokens=1))
    assert isinstance(token, int) and lp.shape == (model.args.vocab_size,)
    assert token == int(tokens[0])
    np.testing.assert_allclose(np.array(lp), np.array(logprobs[0]), atol=1e-4)


def test_prompt_cache_save_and_load_continue_exactly(tmp_path, float_models):
    model, tokenizer = float_models["gemma3"]
    prompt = corpus_prompts(tokenizer, (40,))[0]
    follow = tokenizer.encode(" The keeper", add_special_tokens=False)
    cache = make_prompt_cache(model)
    generate(model, tokenizer, prompt, max_tokens=4, prompt_cache=cache)
    path = str(tmp_path / "cache.safetensors")
    save_prompt_cache(path, cache, {"model": "gemma3"})
    loaded, meta = load_prompt_cache(path, return_metadata=True)
    assert meta == {"model": "gemma3"}
    assert [type(c) for c in loaded] == [type(c) for c in cache]
    a = generate(model, tokenizer, follow, max_tokens=12, prompt_cache=cache)
    b = generate(model, tokenizer, follow, max_tokens=12, prompt_cache=loaded)
    assert a == b and a


def test_stream_batch_generate_streams_each_row(float_models):
    model, tokenizer = float_models["gemma3"]
    prompts = ["Ein Wanderer aus Köln", "灯台の 光は", "Emoji time: 🐋", "def lamp_schedule("]
    pieces = {i: [] for i in range(len(prompts))}
    tokens = {i: [] for i in range(len(prompts))}
    for r in stream_batch_generate(model, tokenizer, prompts, max_tokens=20):
        pieces[r.index].append(r.text)
        if r.finish_reason != "stop":
            tokens[r.index].append(r.token)
        assert "\ufffd" not in r.text
    for i in pieces:
        assert "".join(pieces[i]) == tokenizer.decode(tokens[i])
    batch = batch_generate(model, tokenizer, prompts, max_tokens=20)
    assert batch.texts == ["".join(pieces[i]) for i in range(len(prompts))]


def test_uncached_repo_offline_is_a_clear_error(tmp_path):
    code = ("from mlx_lm_batched import load\n"
            "try:\n    load('nobody-here/no-such-model-xyz')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert "ModelLoadError" in proc.stdout, proc.stdout + proc.stderr
    assert "HF_HUB_OFFLINE" in proc.stdout and "not in the Hugging Face cache" in proc.stdout


def test_cached_repo_loads_offline(tmp_path, float_dirs):
    # A repo id resolves through the Hugging Face cache when HF_HUB_OFFLINE is set.
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--local-org--smollm2"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for f in float_dirs["smollm2"].iterdir():
        (snapshot / f.name).symlink_to(f)
    code = ("from mlx_lm_batched import load, generate\n"
            "model, tok = load('local-org/smollm2')\n"
            "print(repr(generate(model, tok, 'The lighthouse', max_tokens=5)))\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.strip()) > 4


def test_bad_requests_raise_clear_errors(float_models):
    from mlx_lm_batched.sample_utils import make_sampler

    model, tokenizer = float_models["smollm2"]
    with pytest.raises(ValueError, match="temp"):
        make_sampler(temp=-0.5)
    with pytest.raises(ValueError, match="max_tokens"):
        batch_generate(model, tokenizer, [[1, 2]], max_tokens=0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        batch_generate(model, tokenizer, ["fine", ""], max_tokens=2)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, tokenizer, [], max_tokens=2)
