"""The CLI as a user runs it: a subprocess on real prompt files and the default model."""

import json
import os
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "mlx_lm_batched.generate"]


def run_cli(*args, timeout=600, input=None, cwd=None, env=None):
    """Run the CLI as a user does; ``input`` is its stdin (empty when None)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, input=input or "", cwd=cwd)


def error_lines(proc):
    return [l for l in proc.stderr.splitlines() if l.startswith("error:")]


def assert_one_line_error(proc, fragment, code=None):
    assert proc.returncode != 0 if code is None else proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = error_lines(proc)
    assert errors, proc.stderr
    assert any(fragment in e for e in errors), (fragment, errors)


def records(text):
    return [json.loads(l) for l in text.splitlines()]


@pytest.fixture
def prompt_files(tmp_path):
    a = tmp_path / "capital.txt"
    a.write_text("What is the capital of France? Answer in one word.")
    b = tmp_path / "haiku.txt"
    b.write_text("Write a haiku about a lighthouse.")
    return a, b


def test_generates_for_prompt_files_with_outputs(tmp_path, prompt_files):
    a, b = prompt_files
    other = tmp_path / "other"
    other.mkdir()
    a2 = other / "capital.txt"  # same file name in another folder: its own output file
    a2.write_text("What is the capital of Italy? Answer in one word.")
    out_dir = tmp_path / "out"
    jsonl = tmp_path / "results.jsonl"
    proc = run_cli("--prompts", a, b, a2, "--prompt", "Say hello.", "--max-tokens", 12,
                   "--output-dir", out_dir, "--jsonl", jsonl, "--batch-size", 2)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # One output file per prompt; names never collide (deduplicated in prompt order).
    assert sorted(os.listdir(out_dir)) == ["capital-2.out.txt", "capital.out.txt",
                                           "haiku.out.txt", "prompt-1.out.txt"]
    assert "Paris" in (out_dir / "capital.out.txt").read_text()
    assert "Rome" in (out_dir / "capital-2.out.txt").read_text()
    # Records come in the order prompts finish; `index` is the prompt's place.
    recs = sorted(records(jsonl.read_text()), key=lambda r: r["index"])
    assert [r["source"] for r in recs] == ["--prompt #1", str(a), str(b), str(a2)]
    for r in recs:
        assert r["finish_reason"] in ("stop", "length")
        assert 0 < r["generation_tokens"] <= 12 and r["prompt_tokens"] > 5
        assert r["text"].strip()
        assert open(r["output"], encoding="utf-8").read() == r["text"]
    assert os.path.basename(recs[3]["output"]) == "capital-2.out.txt"
    # The summary reports throughput, memory, the weights' form and the BLAS.
    assert "[summary] 4 prompts" in proc.stderr and "tok/s" in proc.stderr
    assert "peak memory" in proc.stderr and "BLAS: " in proc.stderr
    # The default model is quantized: kept as stored, as load() and the server keep it.
    assert "weights: quantized" in proc.stderr


def test_batch_output_matches_single_prompt_run(prompt_files):
    a, b = prompt_files
    both = run_cli("--prompts", a, b, "--max-tokens", 10, "--jsonl", "-", "--no-progress")
    alone = run_cli("--prompts", b, "--max-tokens", 10, "--jsonl", "-", "--no-progress")
    assert both.returncode == 0 and alone.returncode == 0, both.stderr + alone.stderr
    text_both = {json.loads(l)["source"]: json.loads(l)["text"] for l in both.stdout.splitlines()}
    text_alone = json.loads(alone.stdout.splitlines()[0])["text"]
    assert text_both[str(b)] == text_alone


def test_the_cli_gives_the_python_apis_text(prompt_files):
    # One path: the CLI keeps the default quantized model as load() does, so a prompt
    # gets the tokens generate() gives it in Python.
    from mlx_lm_batched import generate, load
    from mlx_lm_batched.demo_models import smollm2_gguf_path

    _, b = prompt_files
    proc = run_cli("--prompts", b, "--max-tokens", 16, "--jsonl", "-", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    model, tokenizer = load(str(smollm2_gguf_path()))
    tokens = tokenizer.apply_chat_template([{"role": "user", "content": b.read_text()}],
                                           add_generation_prompt=True)
    text = generate(model, tokenizer, tokens, max_tokens=16)
    assert json.loads(proc.stdout.splitlines()[0])["text"] == text


def test_missing_and_empty_files_do_not_stop_the_others(tmp_path, prompt_files):
    a, _ = prompt_files
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    proc = run_cli("--prompts", a, tmp_path / "nope.txt", empty, "--max-tokens", 4,
                   "--jsonl", "-", "--no-progress")
    assert_one_line_error(proc, "nope.txt' does not exist")
    assert_one_line_error(proc, "empty.txt' is empty")
    assert proc.returncode == 1
    assert [r["source"] for r in records(proc.stdout)] == [str(a)]


@pytest.mark.parametrize("args, fragment", [
    (["--temp", "-1"], "temp"),
    (["--top-p", "1.5"], "top_p"),
    (["--top-k", "-3"], "top_k"),
    (["--max-tokens", "0"], "--max-tokens"),
])
def test_invalid_sampling_values(args, fragment):
    proc = run_cli("--prompt", "hi", *args)
    assert_one_line_error(proc, fragment)


def test_no_prompts():
    assert_one_line_error(run_cli("--max-tokens", "3"), "no prompts")


def test_unreadable_model_directory(tmp_path):
    proc = run_cli("--model", tmp_path / "missing-model", "--prompt", "hi")
    assert_one_line_error(proc, "does not exist")
    proc = run_cli("--model", tmp_path, "--prompt", "hi")  # exists, but no config.json
    assert_one_line_error(proc, "no config.json")


def test_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "wavenet9000"}))
    proc = run_cli("--model", tmp_path, "--prompt", "hi")
    assert_one_line_error(proc, "unknown model_type 'wavenet9000'")
    assert "llama" in proc.stderr  # it lists what is supported


def test_prompt_over_context_length(tmp_path, prompt_files):
    a, _ = prompt_files
    long_prompt = tmp_path / "long.txt"
    long_prompt.write_text("lighthouse keeper " * 6000)  # ~12k tokens, context is 8192
    proc = run_cli("--prompts", long_prompt, a, "--max-tokens", 3, "--jsonl", "-", "--no-progress",
                   "--no-dequantize")
    assert "weights: quantized |" in proc.stderr
    assert_one_line_error(proc, "over the model's context of 8192")
    assert proc.returncode == 1
    assert [json.loads(l)["source"] for l in proc.stdout.splitlines()] == [str(a)]
