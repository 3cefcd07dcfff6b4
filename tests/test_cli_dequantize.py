"""The CLI keeps a quantized model as stored (as ``load`` and the server do) unless asked
to dequantize it, and ``--dequantize`` stops with one line when the floats cannot fit.

A 7B 4-bit model (about 4 GB packed) would take 30 GB as float32: dequantizing it on a 24
GB machine gets the process killed. ``dequantized_bytes`` reads the float size from shapes
alone. The machine's memory is what varies here: the tests shrink what
``available_memory`` reports to stand for a smaller machine.
"""

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from conftest import model_dir
from mlx_lm_batched import load
from mlx_lm_batched.cli import model as cli_model
from mlx_lm_batched.cli.args import CliError, build_parser
from mlx_lm_batched.demo_models import smollm2_gguf_path
from mlx_lm_batched.engine import kv_budget
from mlx_lm_batched.loading.dequantize import dequantize_for_device, dequantized_bytes, is_quantized

pytestmark = pytest.mark.skipif(mx.default_device() != mx.cpu,
                                reason="the default this guards is the CPU's")


def float32_bytes_after_dequantizing(path):
    model, _ = load(str(path))
    predicted = dequantized_bytes(model, mx.float32)
    dequantize_for_device(model, mx.float32)
    params = tree_flatten(model.parameters())
    assert all(v.dtype == mx.float32 for _, v in params)
    return predicted, sum(v.nbytes for _, v in params)


@pytest.mark.parametrize("source", ["smollm2-gguf-q4_1", "gemma3-q4-convert"])
def test_predicted_float_bytes_are_the_real_ones(source):
    # The Q4_1 GGUF (float16 scales, tied embedding) and our own 4-bit Gemma conversion
    # (quantized embedding, norms kept as floats).
    path = (smollm2_gguf_path() if source.startswith("smollm2")
            else model_dir("gemma3", quantize=True, q_bits=4, q_group_size=64))
    predicted, real = float32_bytes_after_dequantizing(path)
    assert predicted == real


def args_for(*flags):
    return build_parser().parse_args(["--model", str(smollm2_gguf_path()), "--prompt", "hi", *flags])


def packed_and_float_bytes():
    model, _ = load(str(smollm2_gguf_path()))
    packed = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    return packed, dequantized_bytes(model, mx.float32)


def test_default_keeps_the_weights_as_stored_whatever_the_memory(monkeypatch):
    packed, floats = packed_and_float_bytes()
    for available in (floats - packed, 3 * floats):
        monkeypatch.setattr(kv_budget, "available_memory", lambda: available)
        model, _, weights = cli_model.load_model(str(smollm2_gguf_path()), args_for())
        assert weights == "quantized" and is_quantized(model)
        down = model.layers[0].mlp.down_proj
        assert down.bits == 4 and down.weight.dtype == mx.uint32
        # As load() keeps the GGUF: float16 scales, float32 norms (the same computation
        # as the Python API and the server).
        reference, _ = load(str(smollm2_gguf_path()))
        for (name, ours), (_, theirs) in zip(tree_flatten(model.parameters()),
                                             tree_flatten(reference.parameters())):
            assert ours.dtype == theirs.dtype and mx.array_equal(ours, theirs).item(), name


def test_explicit_flags(monkeypatch):
    packed, floats = packed_and_float_bytes()
    monkeypatch.setattr(kv_budget, "available_memory", lambda: floats // 2 - packed)
    # Asked for and impossible: one clear line before the floats are made.
    with pytest.raises(CliError, match=r"--dequantize: the float32 weights need 0\.5 GB and "
                                       r"0\.\d GB is available; run without it"):
        cli_model.load_model(str(smollm2_gguf_path()), args_for("--dequantize"))
    # Asked for, over half but within what is there: done as asked.
    monkeypatch.setattr(kv_budget, "available_memory", lambda: floats - packed)
    model, _, weights = cli_model.load_model(str(smollm2_gguf_path()), args_for("--dequantize"))
    assert weights == "dequantized" and not is_quantized(model)
    # Kept as stored when asked: the GGUF's float16 scales stay.
    model, _, weights = cli_model.load_model(str(smollm2_gguf_path()), args_for("--no-dequantize"))
    assert weights == "quantized" and is_quantized(model)
    assert model.layers[0].mlp.down_proj.scales.dtype == mx.float16
