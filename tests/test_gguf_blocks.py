"""GGUF block quantizations kept as MLX affine triples (``loading/gguf_blocks.py``).

Oracles: gguf-py's reference dequantizer (the arithmetic transformers loads GGUFs with) on
random blocks of every type, bit for bit; the real Gemma-3 Q4_K_M file (Q5_0, Q4_K, Q6_K,
Q8_0 tensors) against its float32 reading, which test_gguf.py checks against transformers;
mlx-lm 0.32 loading the converted directory; and each row of a batch against its prompt alone.
"""

import mlx_lm_batched  # noqa: F401  (before mlx.core: loads the fast BLAS)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants
from mlx.utils import tree_map

from arch_harness import greedy_tokens
from conftest import corpus_prompts, model_dir
from mlx_lm_batched import load
from mlx_lm_batched.loading.gguf import _parse, read_gguf
from mlx_lm_batched.loading.gguf_blocks import AFFINE_TYPES, pack, to_float32, to_mlx_affine

# ggml's byte offsets of the f16 fields in each type's block (d; and m or dmin)
HALF_FIELDS = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2)}


def _random_blocks(ttype, rows, length, seed):
    """Random bytes for every field, with finite f16 scales (random bit patterns may be NaN)."""
    _, size, per_block = AFFINE_TYPES[ttype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, length // per_block, size), dtype=np.uint8)
    for offset in HALF_FIELDS[ttype]:
        half = (rng.standard_normal((rows, length // per_block)) * 0.02).astype(np.float16)
        raw[..., offset:offset + 2] = half[..., None].view(np.uint8)
    return raw.reshape(-1)


@pytest.mark.parametrize("ttype", sorted(AFFINE_TYPES), ids=lambda t: GGMLQuantizationType(t).name)
def test_every_affine_type_matches_the_reference_dequantizer(ttype):
    rows, length = 5, 768
    raw = _random_blocks(ttype, rows, length, seed=ttype)
    ref = quants.dequantize(raw.reshape(rows, -1), GGMLQuantizationType(ttype)).reshape(rows, length)
    np.testing.assert_array_equal(to_float32(ttype, (rows, length), raw), ref)
    weight, scales, biases, bits = to_mlx_affine(ttype, (rows, length), raw)
    assert weight.dtype == np.uint32 and weight.shape == (rows, length * bits // 32)
    assert scales.shape == biases.shape == (rows, length // 32)
    # K-quant scales are d * 6-bit integers: up to 17 mantissa bits, exact in float32 only.
    assert scales.dtype == (np.float32 if ttype in (12, 13) else np.float16)
    deq = mx.dequantize(mx.array(weight), mx.array(scales).astype(mx.float32),
                        mx.array(biases).astype(mx.float32), group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(deq), ref)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_packing_is_mlx_packing(bits):
    top = 2 ** bits - 1
    q = np.random.default_rng(bits).integers(0, top + 1, (3, 64), dtype=np.uint8)
    q[:, [0, 32]], q[:, [1, 33]] = 0, top  # each group spans 0..top: MLX's scale is +-1
    packed, scales, biases = mx.quantize(mx.array(q.astype(np.float32)), group_size=32, bits=bits)
    scales, biases = (np.repeat(np.array(a), 32, axis=1) for a in (scales, biases))
    assert set(np.unique(np.abs(scales))) == {1.0}
    integers = ((q - biases) / scales).astype(np.uint8)  # the values MLX packed
    np.testing.assert_array_equal(pack(integers, bits), np.array(packed))


@pytest.fixture(scope="module")
def gemma_triples(gemma_path):
    return read_gguf(gemma_path)


def test_gemma_q4_k_m_stays_quantized(gemma_path, gemma_triples):
    weights, config, _ = gemma_triples
    floats, _, _ = read_gguf(gemma_path, dtype=mx.float32)
    quant = config["quantization"]
    assert quant == config["quantization_config"]
    kinds = {name: t[0] for name, t in _parse(gemma_path)[1].items()}
    expect = {"model.layers.0.self_attn.q_proj": (kinds["blk.0.attn_q.weight"], 5, mx.float16),  # Q5_0
              "model.layers.0.self_attn.o_proj": (kinds["blk.0.attn_output.weight"], 4, mx.float32),  # Q4_K
              "model.layers.0.self_attn.v_proj": (kinds["blk.0.attn_v.weight"], 8, mx.float16)}  # Q8_0
    assert [kind for kind, _, _ in expect.values()] == [6, 12, 8]
    for module, (_, bits, scale_dtype) in expect.items():
        entry = quant.get(module, quant)  # the default (5 bits) or the module's own
        assert (entry["group_size"], entry["bits"]) == (32, bits), module
        w, s, b = (weights[f"{module}.{p}"] for p in ("weight", "scales", "biases"))
        assert s.dtype == b.dtype == scale_dtype, module
        deq = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=32, bits=bits)
        assert mx.array_equal(deq, floats[f"{module}.weight"]).item(), module  # bit for bit
    # Q6_K (groups of 16, which MLX lacks) is read as float32.
    assert kinds["blk.0.ffn_down.weight"] == 14
    assert weights["model.layers.0.mlp.down_proj.weight"].dtype == mx.float32
    assert "model.layers.0.mlp.down_proj.scales" not in weights
    held = sum(v.nbytes for v in weights.values())
    as_float = sum(v.nbytes for v in floats.values())
    assert held < 0.3 * as_float, (held, as_float)  # 303 MB against 1072 MB


def test_quantized_gemma_batches_exactly_and_tracks_its_floats(gemma_path):
    model, tokenizer = load(gemma_path)  # as stored: 4-, 5- and 8-bit layers
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, nn.QuantizedLinear) and layer.self_attn.q_proj.bits == 5
    assert isinstance(layer.self_attn.o_proj, nn.QuantizedLinear) and layer.self_attn.o_proj.bits == 4
    assert isinstance(layer.mlp.down_proj, nn.Linear)
    prompts = corpus_prompts(tokenizer, (9, 23, 4))
    batch = greedy_tokens(model, prompts, 6)
    for i, prompt in enumerate(prompts):
        np.testing.assert_array_equal(batch[i], greedy_tokens(model, [prompt], 6)[0], err_msg=f"row {i}")
    floats, _ = load(gemma_path, dequantize=True)
    ids = mx.array([prompts[1]])
    got, want = model(ids).astype(mx.float32), floats(ids)
    # The same weights; only the products' rounding differs.
    assert mx.abs(got - want).max().item() < 2e-3 * mx.abs(want).max().item()  # measured 8e-4
    np.testing.assert_array_equal(np.array(mx.argmax(got, -1)), np.array(mx.argmax(want, -1)))


def test_mlx_lm_reads_the_converted_q4_k_m(gemma_path):
    from mlx_lm.utils import load_model as mlx_lm_load_model

    directory = model_dir("gemma3")  # convert as stored: mixed bits, float32 K-quant scales
    ours, _ = load(str(directory))
    theirs, _ = mlx_lm_load_model(directory)
    # mlx-lm would run in float16 (the embedding's scales' dtype), which Gemma's activations
    # overflow; our CPU load widens the floats to float32, so widen theirs the same way.
    theirs.update(tree_map(lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p,
                           theirs.parameters()))
    assert theirs.layers[0].self_attn.o_proj.bits == 4 and theirs.layers[0].self_attn.q_proj.bits == 5
    prompt = mx.array([[2, 651, 6037, 529, 7001, 563]])
    a, b = ours(prompt).astype(mx.float32), theirs(prompt).astype(mx.float32)
    # mlx-lm rounds Gemma's embedding scale sqrt(640) to bfloat16 (transformers and we keep
    # float32): on the float32 conversion that alone gives 6e-4 of the largest logit; 1.4e-3 here.
    assert mx.abs(a - b).max().item() < 3e-3 * mx.abs(b).max().item(), mx.abs(a - b).max().item()
    np.testing.assert_array_equal(np.array(mx.argmax(a, -1)), np.array(mx.argmax(b, -1)))
