"""scripts/make_random_gguf.py: a Llama GGUF of random weights with SmolLM2's tokenizer,
run as a subprocess and loaded by this package as any GGUF file is."""

import subprocess
import sys
from pathlib import Path

import gguf  # a dependency of the package: its GGUF loader reads files with it

from mlx_lm_batched import generate, load
from mlx_lm_batched.demo_models import smollm2_gguf_path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_random_gguf.py"


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=300)


def test_a_small_random_model_loads_and_generates_with_the_donor_tokenizer(tmp_path):
    out = tmp_path / "random.gguf"
    done = run_script("--out", str(out), "--hidden", "128", "--intermediate", "320",
                      "--layers", "3", "--heads", "4", "--kv-heads", "2")
    assert done.returncode == 0, done.stderr
    assert "29 tensors" in done.stderr and "B parameters" in done.stderr

    reader = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert len(types) == 1 + 3 * 9 + 1
    assert types["blk.2.ffn_down.weight"] == "F16" and types["blk.0.attn_norm.weight"] == "F32"
    shape = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    assert shape["blk.0.attn_k.weight"] == (128, 64)  # (in, out): 2 KV heads of 32

    model, tokenizer = load(str(out))
    assert len(model.layers) == 3
    assert model.args.hidden_size == 128 and model.args.num_key_value_heads == 2
    _, donor_tokenizer = load(smollm2_gguf_path())
    text = "Batched generation, one request at a time."
    assert tokenizer.encode(text) == donor_tokenizer.encode(text)
    assert tokenizer.chat_template == donor_tokenizer.chat_template
    reply = generate(model, tokenizer, "Hello", max_tokens=6)
    assert isinstance(reply, str) and reply


def test_heads_that_do_not_divide_the_width_are_refused_in_one_line(tmp_path):
    done = run_script("--out", str(tmp_path / "x.gguf"), "--hidden", "100", "--heads", "3")
    assert done.returncode == 2
    assert "--hidden must divide by --heads" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "x.gguf").exists()
