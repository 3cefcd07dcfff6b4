"""``cache_prompt`` + ``generate --prompt-cache-file`` as users run them, with files
exchanged with mlx-lm 0.32's own command lines in both directions."""

import json
import os
import subprocess
import sys

from conftest import model_dir

DOCUMENT = ("Here is a document: The Eiffel Tower is in Paris and was built in 1889. "
            "Answer the question after it. ")
QUESTIONS = ["When was it built?", "Where is it?"]


def run(module, *args, env=None):
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", **(env or {})))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def ours(cache_file):
    """Every question continuing the cached prefix, in one batch."""
    out = run("mlx_lm_batched.generate", "--prompt-cache-file", cache_file, "-m", 14,
              "--jsonl", "-", "--no-progress", *[a for q in QUESTIONS for a in ("--prompt", q)])
    records = sorted((json.loads(l) for l in out.splitlines() if l.startswith("{")),
                     key=lambda r: r["index"])
    return [r["text"] for r in records]


def mlx_lm_text(cache_file, question):
    out = run("mlx_lm.generate", "--prompt-cache-file", cache_file, "--prompt", question, "-m", 14)
    return out.split("==========\n")[1].rstrip("\n")


def test_prompt_cache_files_move_both_ways_and_serve_a_batch(tmp_path):
    smol = str(model_dir("smollm2", dtype="float32"))
    mine, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    out = run("mlx_lm_batched.cache_prompt", "--model", smol, "--prompt", DOCUMENT,
              "--prompt-cache-file", mine)
    assert "Saving..." in out and mine.stat().st_size > 0
    run("mlx_lm.cache_prompt", "--model", smol, "--prompt", DOCUMENT, "--prompt-cache-file", theirs)

    texts = ours(theirs)  # mlx-lm's file here; --model comes from the file
    assert len(set(texts)) == 2 and all(texts), texts
    assert "1889" in texts[0]  # the answer is in the cached document only
    # Our file in mlx-lm: the second row of our batch is mlx-lm's answer alone.
    assert mlx_lm_text(mine, QUESTIONS[1]) == texts[1]


def test_prompt_cache_file_errors_are_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.generate", "--prompt-cache-file",
                           tmp_path / "missing.safetensors", "--prompt", "hi"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [
        f"error: --prompt-cache-file: prompt cache file not found: {tmp_path}/missing.safetensors"]


def test_quantized_prompt_cache_file_matches_mlx_lm(tmp_path):
    """``cache_prompt --kv-bits 4`` writes mlx-lm's quantized layout; both generators
    continue the file to the same greedy text."""
    from mlx_lm.models.cache import QuantizedKVCache, load_prompt_cache

    smol = str(model_dir("smollm2", dtype="float32"))
    path = tmp_path / "q4.safetensors"
    # The file's layout is what is checked: both sides multiply with the same BLAS (our
    # small-matmul kernel sums in its own order, which moves a late greedy token on some
    # CPUs: AVX2-only AMD EPYC, 2026-12-04).
    same_blas = {"MLX_LM_BATCHED_SMALL_GEMM": "off"}
    run("mlx_lm_batched.cache_prompt", "--model", smol, "--prompt", DOCUMENT,
        "--prompt-cache-file", path, "--kv-bits", 4, "--quantized-kv-start", 0, env=same_blas)
    layers = load_prompt_cache(str(path))
    assert all(isinstance(c, QuantizedKVCache) and c.bits == 4 for c in layers)
    assert layers[0].offset > 20
    out = run("mlx_lm_batched.generate", "--prompt-cache-file", path, "-m", 14, "--jsonl", "-",
              "--no-progress", "--prompt", QUESTIONS[0], env=same_blas)
    text = next(json.loads(l) for l in out.splitlines() if l.startswith("{"))["text"]
    assert text == mlx_lm_text(path, QUESTIONS[0])
