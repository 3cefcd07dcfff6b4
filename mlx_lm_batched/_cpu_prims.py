"""Our own MLX primitives for the CPU backend: decode attention, RMSNorm, RoPE, linear
layers and SwiGLU.

On the CPU, MLX composes these from many small ops: a decode step's attention is about
a dozen dispatches per layer (per-head matmuls, the mask, several passes of softmax, a
second matmul), each a pass over the whole score tensor on one core; ``mx.fast.rope`` and
``mx.fast.rms_norm`` fall back to about 20 and 8 graph nodes per call. At batch 16
attention took 40% of SmolLM2's decode step, RoPE and RMSNorm together about a quarter
(scripts/profile_decode.py). Here each is one primitive (``native/decode_attention.cpp``,
``native/norm_rope.cpp``):

- ``decode_attention``: one (row, KV head) per task on every core, each key and value
  row read once for the query heads that share it, masked slots skipped: a row's output
  is the same bits alone or in any batch, whatever its padding;
- ``rms_norm`` and ``rope``: one pass over the rows, each row computed alone;
- ``linear``: ``nn.Linear``'s ``x @ W.T`` (+ bias) by the same BLAS call MLX makes
  (the same bits), as one node instead of MLX's four (``native/linear.cpp``);
- ``swiglu``: a gated MLP's ``silu(gate) * up`` with ``layers/cpu_ops``' exp formula
  (the same bits), one node instead of about ten (``native/swiglu.cpp``).

They are a C++ MLX extension, built on first use with the system's C++ compiler against
the installed MLX and nanobind (about 20 s once per machine; cached like
``_small_gemm``'s kernel) and imported into this process. Where that is not possible (no
compiler, no Python headers, a nanobind whose ABI is not MLX's), MLX's own ops serve and
:data:`problem` says why. Other devices always use ``mx.fast``.

Environment: ``MLX_LM_BATCHED_CPU_PRIMITIVES``: ``auto`` (default) or ``off`` (``0``);
``CXX``: the compiler (default ``c++``). Threads: ``_small_gemm``'s
(``MLX_LM_BATCHED_GEMM_THREADS``).
"""

import contextlib
import importlib.machinery
import importlib.util
import logging
import math
import os
import sys
import sysconfig

import mlx.core as mx

from . import _native_build, _small_gemm

ENV = "MLX_LM_BATCHED_CPU_PRIMITIVES"
MODULE = "_mlxlmb_cpu_prims"  # NB_MODULE's name in native/cpu_prims.cpp
NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")
SOURCES = [os.path.join(NATIVE, name)
           for name in ("cpu_prims.cpp", "decode_attention.cpp", "norm_rope.cpp", "linear.cpp",
                        "swiglu.cpp", "quantized_linear.cpp", "quantized_linear_primitive.cpp",
                        "quantized_rows.cpp", "quantized_rows_avx2.cpp", "split_gemm.cpp",
                        "half_linear.cpp", "shared_work.cpp")]
# Widths of MLX affine weights the quantized linear primitive unpacks: all of MLX's.
QUANTIZED_BITS = (1, 2, 3, 4, 5, 6, 8)
HEADERS = [os.path.join(NATIVE, name) for name in ("cpu_prims.h", "lanes.h", "exp_lanes.h",
                                                  "quantized_rows.h", "shared_work.h")]
# -ffp-contract=off: no fused multiply-adds the source does not write (g++ fuses them in
# C++ even with -std=c++20), so the exp and SiLU formulas round as cpu_ops' MLX ops do
# and SwiGLU gives their very bits (a tensor-parallel check saw the difference).
CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-fast-math", "-ffp-contract=off",
             "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-DNDEBUG",
             "-DNB_DOMAIN=mlx"]

_module = None
_decided = False  # whether loading was attempted
problem = None  # why the kernel is not in use, when it was asked for and is not


def requested():
    """False when ``MLX_LM_BATCHED_CPU_PRIMITIVES`` switches them off.

    Raises ValueError for a value other than auto, 1, on, 0, off.
    """
    value = os.environ.get(ENV, "").strip().lower()
    if value not in ("", "auto", "1", "on", "0", "off"):
        raise ValueError(f"{ENV}={value!r}: expected auto, on, 1, off or 0")
    return value not in ("0", "off")


def _build():
    try:
        import nanobind
    except ImportError:
        raise OSError("nanobind is not installed") from None
    mlx_dir = os.path.dirname(os.path.abspath(mx.__file__))
    nb_dir = os.path.dirname(os.path.abspath(nanobind.__file__))
    python_include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(python_include, "Python.h")):
        raise OSError(f"no Python headers (Python.h) under {python_include}")
    includes = [os.path.join(nb_dir, "include"),
                os.path.join(nb_dir, "ext", "robin_map", "include"),
                python_include, os.path.join(mlx_dir, "include")]
    lib_dir = os.path.join(mlx_dir, "lib")
    flags = CXX_FLAGS + [f"-I{d}" for d in includes] + [
        f"-L{lib_dir}", "-lmlx", f"-Wl,-rpath,{lib_dir}"]
    compiler = _native_build.find_compiler("CXX", "c++")
    if compiler is None:
        raise OSError("no C++ compiler (c++) to build the CPU primitives")
    sources = SOURCES + [os.path.join(nb_dir, "src", "nb_combined.cpp")]
    return _native_build.cached_build(
        "cpu_prims", "CPU primitives", compiler, sources, flags, _native_build.BuildOptions(
            suffix=sysconfig.get_config_var("EXT_SUFFIX") or ".so", headers=tuple(HEADERS),
            # The binary links this environment's libmlx by path (rpath): another venv
            # with the same versions must build its own, or two MLX libraries would load.
            key_parts=(mx.__version__, nanobind.__version__, sys.version, mlx_dir, nb_dir)))


def _import(path):
    spec = importlib.util.spec_from_file_location(
        MODULE, path, loader=importlib.machinery.ExtensionFileLoader(MODULE, path))
    with _native_build.briefly_spinning_openmp_threads():  # it may be the first to bring libgomp
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def _check(module):
    """Each primitive against MLX's ops on a small case: a nanobind whose ABI is not
    MLX's fails here (the array type is not recognised), not mid-decode."""
    keys = mx.random.normal((2, 2, 5, 8), key=mx.random.key(0))
    values = mx.random.normal((2, 2, 5, 8), key=mx.random.key(1))
    queries = mx.random.normal((2, 4, 1, 8), key=mx.random.key(2))
    mask = mx.array([[True] * 5, [False, False, True, True, True]])[:, None, None, :]
    got = module.decode_attention(queries, keys, values, 0.35, mask)
    k, v = mx.repeat(keys, 2, axis=1), mx.repeat(values, 2, axis=1)
    scores = mx.where(mask, (queries * 0.35) @ k.swapaxes(-1, -2), -mx.inf)
    want = mx.softmax(scores, axis=-1, precise=True) @ v
    if not mx.allclose(got, want, rtol=1e-5, atol=1e-6).item():
        raise OSError("the decode-attention primitive disagrees with MLX's ops")
    cut = [keys[:, :, :2], keys[:, :, 2:]], [values[:, :, :2], values[:, :, 2:]]
    if not mx.array_equal(module.decode_attention_segments(queries, *cut, 0.35, mask),
                          got).item():
        raise OSError("decode attention over segments disagrees with the joined keys")
    x, w = mx.random.normal((3, 2, 4, 40), key=mx.random.key(3)), mx.arange(40) / 7.0
    if not mx.allclose(module.rms_norm(x, w, 1e-5), mx.fast.rms_norm(x, w, 1e-5),
                       rtol=1e-5, atol=1e-6).item():
        raise OSError("the RMSNorm primitive disagrees with MLX's ops")
    offset = mx.array([0, 7, -2], dtype=mx.int32)
    rotated = module.rope(x, 32, False, inverse_frequencies(32, 10000.0), 1.0, offset)
    want = mx.fast.rope(x, 32, traditional=False, base=10000.0, scale=1.0, offset=offset)
    if not mx.allclose(rotated, want, rtol=1e-5, atol=1e-5).item():
        raise OSError("the RoPE primitive disagrees with MLX's ops")
    if not module.linear_available():
        raise OSError("no cblas_sgemm in this process for the linear primitive")
    w, b = mx.random.normal((24, 40), key=mx.random.key(4)), mx.arange(24) / 5.0
    if not (mx.array_equal(module.linear(x, w), x @ w.T).item()
            and mx.array_equal(module.linear(x, w, b), mx.addmm(b, x, w.T)).item()):
        raise OSError("the linear primitive disagrees with MLX's matmul")
    gate = x * 4.0
    if not mx.allclose(module.swiglu(gate, x), gate * mx.sigmoid(gate) * x,
                       rtol=1e-5, atol=1e-6).item():
        raise OSError("the SwiGLU primitive disagrees with MLX's ops")
    for bits in QUANTIZED_BITS:
        wq, scales, biases = mx.quantize(mx.random.normal((24, 64), key=mx.random.key(5)),
                                         group_size=32, bits=bits)
        # 6 rows (the tiled kernel) and 72 (the dequantized prefill path).
        for rows in (mx.random.normal((3, 2, 64), key=mx.random.key(6)),
                     mx.random.normal((72, 64), key=mx.random.key(7))):
            want = mx.quantized_matmul(rows, wq, scales, biases, transpose=True,
                                       group_size=32, bits=bits) + b
            got = module.quantized_linear(rows, wq, scales, biases, b, 32, bits)
            if not mx.allclose(got, want, rtol=1e-5, atol=1e-4).item():
                raise OSError("the quantized linear primitive disagrees with MLX's "
                              "quantized_matmul")
            both = module.quantized_linears(rows, [wq, wq[:8]], [scales, scales[:8]],
                                            [biases, biases[:8]], [b, None], 32, bits)
            alone = module.quantized_linear(rows, wq[:8], scales[:8], biases[:8], None, 32, bits)
            if not (mx.array_equal(both[0], got).item()
                    and mx.array_equal(both[1], alone).item()):
                raise OSError("the quantized linear primitive of several layers disagrees "
                              "with the layers one at a time")


def configured_threads():
    """The threads the kernels split their work over: the small-row matmul's count."""
    return _small_gemm.threads or _small_gemm.default_threads()


def module():
    """The loaded extension, building it on first use; None where it cannot be (see
    :data:`problem`) or is switched off, or off the CPU backend's platforms (Linux)."""
    global _module, _decided, problem
    if _decided:
        return _module
    _decided = True
    if not requested() or not sys.platform.startswith("linux"):
        return None
    try:
        loaded = _import(_build())
        loaded.set_threads(configured_threads())
        _check(loaded)
        # The small-row float32 matmul shares its products out the same way.
        _small_gemm.share_threads_with(loaded.share_chunks_address())
    except Exception as e:  # noqa: BLE001 (any failure: MLX's ops give the same values)
        problem = f"{type(e).__name__}: {e}".splitlines()[0]
        # Said once, on stderr: decoding still works, only slower (about 1.6x at batch 1).
        logging.getLogger(__name__).warning(
            "CPU primitives not built, MLX's ops serve (slower decode): %s", problem)
        return None
    _module = loaded
    return _module


def inverse_frequencies(dims, base):
    """RoPE's inverse frequencies ``base ** (-2i / dims)`` by MLX's own formula (what
    ``mx.fast.rope``'s CPU fallback computes from ``base``)."""
    half = dims // 2
    return mx.exp(mx.arange(half, dtype=mx.float32) * (-math.log(base) / half))


_FLOATS = (mx.float32, mx.float16, mx.bfloat16)
HALF_FLOATS = (mx.float16, mx.bfloat16)


def _on_cpu_float(x):
    """On the CPU backend, in a dtype the primitives read (half precision is computed in
    float32 and each primitive's output rounded once to the input's dtype)."""
    return x.dtype in _FLOATS and mx.default_device() == mx.cpu


def serves(q, k, v, mask):
    """True when :func:`attend` computes this attention: on the CPU, one query per row,
    queries, keys and values of one float dtype (float32, float16 or bfloat16) as arrays,
    a boolean mask shared by the heads (or none)."""
    segments = k if isinstance(k, list) else [k]
    if q.ndim != 4 or q.shape[2] != 1 or not all(isinstance(x, mx.array) for x in segments):
        return False
    values = v if isinstance(v, list) else [v]
    if not (_on_cpu_float(q) and all(x.dtype == q.dtype for x in segments + values)):
        return False
    if mask is not None:
        if not isinstance(mask, mx.array) or mask.dtype != mx.bool_ or mask.ndim > 4:
            return False
        if mask.ndim >= 3 and mask.shape[-3] != 1 or mask.ndim >= 2 and mask.shape[-2] != 1:
            return False
    return module() is not None


def attend(q, k, v, scale, mask):
    """``softmax(q k^T * scale) v`` for queries ``(B, H, 1, D)`` over keys and values
    ``(B, n_kv, S, D)`` (GQA when ``n_kv < H``), masked slots skipped. ``k``/``v`` may be
    lists of segments of consecutive slots (``(B, n_kv, S_i, D)`` each, a cache that
    shares a prefix's blocks): read in place, with the same bits as joined."""
    if isinstance(k, list):
        return _module.decode_attention_segments(q, k, v, float(scale), mask)
    return _module.decode_attention(q, k, v, float(scale), mask)


def rms_norm(x, weight, eps):
    """``mx.fast.rms_norm(x, weight, eps)``, as one primitive on the CPU for float32,
    float16 and bfloat16 (computed in float32, rounded once to the output dtype)."""
    if (_on_cpu_float(x) and (weight is None or weight.dtype in _FLOATS)
            and module() is not None):
        return _module.rms_norm(x, weight, float(eps))
    return mx.fast.rms_norm(x, weight, eps)


def rope(x, dims, traditional, inv_freq, scale, offset):
    """Rotary embedding of ``x`` ``(B, ..., L, D)``'s first ``dims`` features at
    positions ``offset + arange(L)`` (``offset``: an int or ``(B,)`` array), as one
    primitive on the CPU for float32, float16 and bfloat16 (computed in float32, rounded
    once to ``x``'s dtype); None where it does not serve (the caller uses
    ``mx.fast.rope``)."""
    if x.ndim < 3 or not _on_cpu_float(x) or inv_freq.dtype != mx.float32 or module() is None:
        return None
    if not isinstance(offset, mx.array):
        offset = mx.array([offset])
    elif offset.ndim == 0:
        offset = offset.reshape(1)
    if offset.ndim != 1 or offset.shape[0] not in (1, x.shape[0]):
        return None
    return _module.rope(x, dims, traditional, inv_freq, float(scale), offset.astype(mx.int32))


def linear(x, weight, bias=None):
    """``x @ weight.T (+ bias)`` (``mlx.nn.Linear``'s product) as one primitive on the
    CPU; None where it does not serve (the caller uses MLX's ops). Float32: the same bits
    as MLX's ops, one node instead of the four MLX builds around each layer's matmul. A
    float16 or bfloat16 weight (``native/half_linear.cpp``): read in its own dtype and
    computed in float32, the output rounded once to the dtype MLX's matmul gives (MLX's
    own half matmul on the CPU skips the BLAS: a bfloat16 SmolLM2 prefilled at about 20
    tok/s)."""
    if (weight.dtype in HALF_FLOATS and weight.ndim == 2 and _on_cpu_float(x)
            and (bias is None or bias.dtype in _FLOATS) and module() is not None):
        return _module.half_linear(x, weight, bias)
    if (not _on_cpu_float(x) or x.dtype != mx.float32 or weight.dtype != mx.float32
            or weight.ndim != 2
            or (bias is not None and bias.dtype != mx.float32) or module() is None):
        return None
    return _module.linear(x, weight, bias)


def quantized_linear(x, weight, scales, biases, bias, group_size, bits):
    """``mx.quantized_matmul(x, weight, scales, biases, transpose=True)`` (+ ``bias``)
    for affine weights of :data:`QUANTIZED_BITS` as one primitive on the CPU for a float32, float16 or
    bfloat16 ``x`` (computed in float32: to float32 rounding, not MLX's bits); None where
    it does not serve."""
    if not quantized_linear_serves(x, weight, biases, bias, group_size, bits):
        return None
    return _module.quantized_linear(x, weight, scales, biases, bias, group_size, bits)


def quantized_linear_serves(x, weight, biases, bias, group_size, bits):
    """Whether :func:`quantized_linear`'s primitive takes these arguments."""
    return not (x.dtype not in _FLOATS or mx.default_device() != mx.cpu
                or bits not in QUANTIZED_BITS or group_size not in (32, 64, 128)
                or biases is None or weight.dtype != mx.uint32 or weight.ndim != 2
                or (bias is not None and bias.dtype not in _FLOATS) or module() is None)


def quantized_linears(x, layers):
    """:func:`quantized_linear` of several layers of one input, ``layers`` a sequence of
    ``(weight, scales, biases, bias, group_size, bits)`` of one width and group, as one
    primitive of one output per layer (its decode rows in one parallel region: a step's
    query, key and value projections); None where it does not serve."""
    group_size, bits = layers[0][4], layers[0][5]
    if any(layer[4:] != (group_size, bits) for layer in layers):
        return None
    for weight, scales, biases, bias, _, _ in layers:
        if not quantized_linear_serves(x, weight, biases, bias, group_size, bits):
            return None
    return _module.quantized_linears(x, *[list(parts) for parts in zip(*layers)][:4],
                                     group_size, bits)


def swiglu(gate, up):
    """``silu(gate) * up`` (a gated MLP's activation, ``layers/cpu_ops``' exp formula)
    as one primitive on the CPU for float32, float16 or bfloat16 operands of one shape
    (computed in float32, rounded once to their dtype); None where it does not serve."""
    if (not _on_cpu_float(gate) or up.dtype != gate.dtype or gate.shape != up.shape
            or module() is None):
        return None
    return _module.swiglu(gate, up)


@contextlib.contextmanager
def switched_off():
    """MLX's ops instead of these primitives inside the block (benchmarks and tests
    compare the two; evaluate pending work first, MLX computes lazily)."""
    global _module
    loaded = module()
    _module = None
    try:
        yield
    finally:
        _module = loaded


def describe():
    """A short phrase for benchmark headers: ``"CPU primitives (attention, RMSNorm,
    RoPE, linear, SwiGLU, quantized linear)"``, ``"CPU primitives off"`` or ``"CPU
    primitives not built: <why>"``."""
    if _module is not None:
        return "CPU primitives (attention, RMSNorm, RoPE, linear, SwiGLU, quantized linear)"
    if problem:
        return f"CPU primitives not built: {problem}"
    if not requested():
        return "CPU primitives off"
    return "CPU primitives (not yet used)"
