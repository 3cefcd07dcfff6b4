"""The CPU formulas of ``layers/cpu_ops.py`` run fused by ``mx.compile``: the fused and
the unfused ops give the same bits (so the switch, and a machine without a C++
compiler, never changes a token), and ``MLX_LM_BATCHED_COMPILE=0`` turns fusing off."""

import mlx.core as mx
import pytest

from mlx_lm_batched.layers import cpu_ops

FORMULAS = {"exp": cpu_ops.exp, "silu": cpu_ops.silu,
            "softmax": lambda x: cpu_ops.softmax(x, axis=-1)}


def _with_fusing(monkeypatch, on):
    monkeypatch.setenv(cpu_ops.COMPILE_ENV, "1" if on else "0")
    monkeypatch.setattr(cpu_ops, "_fused_ok", None)
    return cpu_ops.fused()


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_fused_and_unfused_formulas_give_the_same_bits(monkeypatch, name):
    x = mx.random.normal((3, 5, 2, 300), key=mx.random.key(7)) * 60  # past both clips
    inputs = [x, x[..., ::3], x.transpose(0, 3, 1, 2), x.astype(mx.bfloat16),
              x.astype(mx.float16)]
    with mx.stream(mx.cpu):
        assert _with_fusing(monkeypatch, True)
        fused = [FORMULAS[name](v) for v in inputs]
        assert not _with_fusing(monkeypatch, False)
        plain = [FORMULAS[name](v) for v in inputs]
        for i, (a, b) in enumerate(zip(fused, plain)):
            assert a.dtype == b.dtype and a.shape == b.shape, i
            assert mx.array_equal(a, b, equal_nan=True).item(), i
        # And the formula is still exp's: within float32 rounding of MLX's own.
        ref = mx.exp(x) if name == "exp" else None
        if ref is not None:
            close = mx.abs(fused[0] - ref) <= 4e-7 * ref + 1e-30
            assert mx.all(close | (x > 88)).item()


def test_a_failing_compile_falls_back_to_the_unfused_ops(monkeypatch):
    def broken(*args):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setitem(cpu_ops._FUSED, "head", broken)
    assert not _with_fusing(monkeypatch, True)
    x = mx.array([-1.0, 0.0, 2.0])
    assert mx.allclose(cpu_ops.silu(x), x * mx.sigmoid(x)).item()
