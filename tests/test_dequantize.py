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

from mlx_lm_batched import batch_generate, convert, load, stream_generate
from mlx_lm_batched.batching import left_pad
from mlx_lm_batched.cli import build_parser
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
