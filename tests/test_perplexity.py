"""``mlx_lm_batched.perplexity``: mlx-lm 0.32's perplexity, checked against mlx-lm's own
``eval_ppl`` (the oracle, run on mlx-lm's load of the same SmolLM2 directory) and its
datasets' tokenization of each record format; the command line's report."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from conftest import CORPUS

ROOT = Path(__file__).resolve().parent.parent


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def text_records():
    paragraphs = [p.strip() for p in CORPUS.split("\n\n") if len(p.strip()) > 40]
    return [{"text": p} for p in paragraphs[:24]]


def test_record_tokens_match_mlx_lm_datasets(float_models):
    """Text, chat and prompt/completion records become the tokens mlx-lm's training
    datasets make of them (its ``create_dataset(...).process``)."""
    import types

    from mlx_lm.tuner.datasets import create_dataset

    from mlx_lm_batched.api.perplexity import record_tokens
    _, tokenizer = float_models["smollm2"]
    formats = [text_records()[:3],
               [{"messages": [{"role": "user", "content": "Hi there"},
                              {"role": "assistant", "content": "Hello! How can I help?"}]}],
               [{"prompt": "2 + 2?", "completion": "4"}]]
    config = types.SimpleNamespace()
    for records in formats:
        theirs = create_dataset(records, tokenizer, config)
        for record in records:
            assert record_tokens(tokenizer, record) == theirs.process(record)[0]


def test_eval_ppl_matches_mlx_lm(float_dirs, float_models, tmp_path):
    """The same rows scored by this package's model and by mlx-lm's (its eval_ppl on
    its load of the directory): the same perplexity and standard error; batch size
    changes nothing."""
    from mlx_lm.perplexity import eval_ppl as lm_eval_ppl
    from mlx_lm.utils import load as lm_load

    from mlx_lm_batched.perplexity import eval_ppl, load_data
    model, tokenizer = float_models["smollm2"]
    path = write_jsonl(tmp_path / "train.jsonl", text_records())
    np.random.seed(0)
    data = load_data(tokenizer, tmp_path, num_samples=6, sequence_length=48)
    assert data.shape == (6, 48)
    np.random.seed(0)
    assert np.array_equal(np.array(load_data(tokenizer, path, 6, 48)), np.array(data))
    ours = eval_ppl(model, data, batch_size=4)
    assert eval_ppl(model, data, batch_size=1) == pytest.approx(ours, rel=1e-5)
    their_model, _ = lm_load(str(float_dirs["smollm2"]))
    theirs = lm_eval_ppl(their_model, data, batch_size=4)
    assert ours == pytest.approx(theirs, rel=1e-4)
    assert 1.0 < ours[0] < 1000.0 and 0 < ours[1] < ours[0]
    everything = load_data(tokenizer, path, num_samples=-1, sequence_length=48)
    assert len(everything) > len(data)


def test_perplexity_command_line_reports_mlx_lm_lines(float_dirs, float_models, tmp_path):
    from mlx_lm_batched.perplexity import eval_ppl, load_data
    write_jsonl(tmp_path / "train.jsonl", text_records())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = [sys.executable, "-m", "mlx_lm_batched.perplexity", "--model",
            str(float_dirs["smollm2"]), "--data-path", str(tmp_path), "--sequence-length", "32",
            "--num-samples", "4", "--batch-size", "2", "--seed", "5"]
    run = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    line = next(x for x in run.stdout.splitlines() if x.startswith("Perplexity: "))
    ppl, se = (float(v) for v in line[len("Perplexity: "):].split(" ± "))
    model, tokenizer = float_models["smollm2"]
    np.random.seed(5)
    expected = eval_ppl(model, load_data(tokenizer, tmp_path, 4, 32), 2)
    assert (ppl, se) == pytest.approx(expected, abs=2e-3)
    assert "Total tokens: 128" in run.stdout and math.isfinite(ppl)
    bad = subprocess.run(args[:5] + ["--data-path", "allenai/tulu-3-sft-mixture"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "reads no Hub datasets" in bad.stderr
    mx.clear_cache()
