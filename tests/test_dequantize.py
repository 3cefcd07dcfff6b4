"""``load(..., dequantize=True)``: a 4-bit model turned into floats at load gives the
same greedy tokens, and logits within float tolerance, as the 4-bit model itself.

Uses a tiny random llama (transformers as the source) converted to 4 bits, so it
runs in seconds.
"""

import mlx_lm_batched  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from arch_harness import BASE_SMALL, VOCAB, build_hf_model
from mlx.utils import tree_flatten

from mlx_lm_batched import batch_generate, load, stream_generate, convert
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.cli.args import build_parser
from mlx_lm_batched.models.cache import make_prompt_cache

PROMPTS = [[3, 17, 99, 5, 42, 8, 77], [64, 2], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [9]]


def save_tokenizer(directory):
    """A word-level tokenizer over the tiny vocabulary ("t0" ... "t127")."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1").save_pretrained(
        directory)


@pytest.fixture(scope="module")
def q4_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("dequantize")
    hf = build_hf_model("llama", dict(BASE_SMALL, tie_word_embeddings=False), std=0.1)
    hf.save_pretrained(root / "hf")
    save_tokenizer(root / "hf")
    return convert(str(root / "hf"), str(root / "q4"), quantize=True, q_bits=4, q_group_size=32)


def padded_logits(model, prompts):
    tokens, padding = left_pad(prompts)
    cache = make_prompt_cache(model)
    offset = mx.array([-p for p in padding])
    model(tokens[:, :-1], offset=offset, cache=cache)
    return np.array(model(tokens[:, -1:], offset=offset + tokens.shape[1] - 1, cache=cache)[:, -1])


def test_dequantized_model_matches_4bit(q4_dir):
    quantized, tokenizer = load(str(q4_dir))
    floats, _ = load(str(q4_dir), dequantize=True)
    q_layers = [m for _, m in quantized.named_modules() if isinstance(m, nn.QuantizedLinear)]
    assert q_layers, "the conversion should have quantized the projections"
    assert not any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
                   for _, m in floats.named_modules())
    params = dict(tree_flatten(floats.parameters()))
    assert all(v.dtype == mx.float32 for v in params.values())
    # The memory trade-off: floats take several times the 4-bit bytes.
    q_bytes = sum(v.nbytes for _, v in tree_flatten(quantized.parameters()))
    assert sum(v.nbytes for v in params.values()) > 3 * q_bytes

    np.testing.assert_allclose(padded_logits(floats, PROMPTS), padded_logits(quantized, PROMPTS),
                               atol=1e-4, rtol=1e-5)

    ours = batch_generate(floats, tokenizer, PROMPTS, max_tokens=12, return_token_ids=True)
    ref = batch_generate(quantized, tokenizer, PROMPTS, max_tokens=12, return_token_ids=True)
    assert ours.token_ids == ref.token_ids
    solo = [r.token for r in stream_generate(floats, tokenizer, PROMPTS[0], max_tokens=12)]
    assert solo[: len(ours.token_ids[0])] == ours.token_ids[0]


def test_cli_has_dequantize_flag():
    assert build_parser().parse_args(["--dequantize"]).dequantize


@pytest.fixture(scope="module")
def q4_half_dir(tmp_path_factory, q4_dir):
    """The tiny llama quantized with float16 scales (and float16 norms)."""
    root = tmp_path_factory.mktemp("dequantize_half")
    return convert(str(q4_dir.parent / "hf"), str(root / "q4"), quantize=True, q_bits=4,
                   q_group_size=32, dtype="float16")


def test_dequantize_on_the_cpu_gives_float32(q4_half_dir):
    # MLX's CPU float16 matmuls skip the BLAS: on the CPU, dequantized weights are float32
    # whatever the checkpoint's float dtype, and exactly what the float16 scales encode.
    assert mx.default_device() == mx.cpu
    quantized, _ = load(str(q4_half_dir))
    assert quantized.model.norm.weight.dtype == mx.float16
    floats, _ = load(str(q4_half_dir), dequantize=True)
    params = dict(tree_flatten(floats.parameters()))
    assert {v.dtype for v in params.values()} == {mx.float32}
    q = quantized.model.layers[0].self_attn.q_proj
    exact = mx.dequantize(q.weight, q.scales.astype(mx.float32), q.biases.astype(mx.float32),
                          q.group_size, q.bits)
    assert mx.array_equal(params["model.layers.0.self_attn.q_proj.weight"], exact).item()
    # An explicit dtype still wins.
    half, _ = load(str(q4_half_dir), dequantize=True, dtype=mx.float16)
    assert {v.dtype for _, v in tree_flatten(half.parameters())} == {mx.float16}


def test_dequantized_gguf_equals_its_float32_conversion(float_dirs):
    # The CLI's default model: its Q4_1 GGUF loaded with dequantize=True on the CPU is the
    # float32 model that `convert --dtype float32` writes, weight for weight.
    from mlx_lm_batched.demo_models import smollm2_gguf_path

    floats, _ = load(smollm2_gguf_path(), dequantize=True)
    ref, _ = load(str(float_dirs["smollm2"]))
    got, want = dict(tree_flatten(floats.parameters())), dict(tree_flatten(ref.parameters()))
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name].dtype == mx.float32, name
        assert mx.array_equal(got[name], value).item(), name


def test_cli_dequantizes_the_default_model_to_float32_when_asked():
    # The CLI's own loader (not load(dequantize=True)): the Q4_1 GGUF's float16 scales once
    # made its dequantized layers float16, which MLX's CPU matmuls run 5x slower.
    from mlx_lm_batched.cli.model import load_model
    from mlx_lm_batched.demo_models import smollm2_gguf_path

    model, _, weights = load_model(smollm2_gguf_path(), build_parser().parse_args(["--dequantize"]))
    assert weights == "dequantized"
    assert {v.dtype for _, v in tree_flatten(model.parameters())} == {mx.float32}
    for flags in ([], ["--no-dequantize"]):
        kept, _, weights = load_model(smollm2_gguf_path(), build_parser().parse_args(flags))
        assert weights == "quantized"
        assert isinstance(kept.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
