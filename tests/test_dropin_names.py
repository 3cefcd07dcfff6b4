"""The names mlx-lm users import resolve here and behave like mlx-lm's: penalties,
model writing (save / save_model / quantize_model / load_tokenizer on the real
SmolLM2), the models.base mask and attention views, the models.cache class names."""

import importlib
import inspect

import mlx.core as mx
import mlx_lm
import pytest

from mlx_lm_batched import load
from mlx_lm_batched.generate import generate_step

# Modules whose public names mlx-lm user code imports (training and evaluation left out).
MODULES = ["", ".generate", ".sample_utils", ".utils", ".models.cache", ".models.base",
           ".tokenizer_utils", ".convert"]
BRIEF = {
    ".sample_utils": ["make_repetition_penalty", "make_presence_penalty", "make_frequency_penalty"],
    ".utils": ["load_tokenizer", "quantize_model", "save", "save_model"],
    ".models.base": ["create_attention_mask", "create_causal_mask", "scaled_dot_product_attention"],
    ".models.cache": ["QuantizedKVCache", "BatchKVCache", "BatchRotatingKVCache", "ChunkedKVCache",
                      "ArraysCache", "CacheList"],
}


def mlx_lm_public(mod):
    """Public functions and classes defined in mlx-lm's module ``mod`` (or its __all__)."""
    m = importlib.import_module("mlx_lm" + mod)
    names = getattr(m, "__all__", None)
    if names is None:
        names = [n for n, v in vars(m).items() if not n.startswith("_")
                 and (inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == m.__name__]
    return sorted(names)


def test_mlx_lm_names_resolve():
    resolved, missing = [], []
    for mod in MODULES:
        ours = importlib.import_module("mlx_lm_batched" + mod)
        for name in mlx_lm_public(mod):
            (resolved if hasattr(ours, name) else missing).append(f"mlx_lm{mod}.{name}")
    for mod, names in BRIEF.items():
        for name in names:
            assert f"mlx_lm{mod}.{name}" in resolved
    # 64 of 98 with mlx-lm 0.32.2 (the rest: speculative decoding, Metal wired limits,
    # hub upload, sharded/pipeline loading, quantized KV caches, adapters, CLI parsers).
    assert len(resolved) >= 64, missing
    assert mlx_lm.__version__  # the reference really is installed


def test_penalties_match_mlx_lm():
    from mlx_lm import sample_utils as ref

    from mlx_lm_batched import sample_utils as ours

    logits = mx.random.normal((3, 64))
    history = mx.array([[1, 2, 2, 5, 9], [3, 3, 3, 7, 7], [0, 1, 2, 3, 63]])
    for name, penalty in [("make_repetition_penalty", 1.3), ("make_presence_penalty", 0.5),
                          ("make_frequency_penalty", 0.7)]:
        batched = getattr(ours, name)(penalty, 4)(history, logits)
        for row in range(3):
            one = getattr(ref, name)(penalty, 4)(history[row], mx.array(logits[row : row + 1]))
            assert mx.allclose(batched[row : row + 1], one).item(), (name, row)
            # mlx-lm's own contract: (T,) history, (1, V) logits.
            assert mx.allclose(getattr(ours, name)(penalty, 4)(history[row], logits[row : row + 1]),
                               one).item()
    with pytest.raises(ValueError, match="repetition penalty"):
        ours.make_repetition_penalty(-1.0)


def test_quantize_save_load_roundtrip(float_dirs, tmp_path):
    from mlx_lm_batched.utils import load_config, load_tokenizer, quantize_model, save, save_model

    src = float_dirs["smollm2"]
    model, tokenizer = load(str(src))
    model, config = quantize_model(model, load_config(src), 64, 4)
    assert config["quantization"] == {"group_size": 64, "bits": 4, "mode": "affine"}
    prompt = mx.array(tokenizer.encode("The capital of France is"))
    expected = [int(t) for (t, _), _ in zip(generate_step(prompt, model), range(6))]
    save_model(tmp_path / "weights_only", model)  # keeps the model usable
    assert (tmp_path / "weights_only" / "model.safetensors.index.json").exists()
    save(tmp_path / "q4", src, model, tokenizer, config)
    reloaded, tok2 = load(str(tmp_path / "q4"))
    assert [int(t) for (t, _), _ in zip(generate_step(prompt, reloaded), range(6))] == expected
    assert tok2.encode("hello world") == tokenizer.encode("hello world")
    tok3 = load_tokenizer(tmp_path / "q4", eos_token_ids=[7])
    assert set(tok3.eos_token_ids) == {7, tokenizer.eos_token_id}
    with pytest.raises(NotImplementedError, match="global_scale"):
        quantize_model(reloaded, config, 64, 4, global_scale=True)


def test_mask_and_attention_views_match_mlx_lm():
    from mlx_lm.models import base as ref

    from mlx_lm_batched.models import base as ours

    for n, offset, window in [(4, 0, None), (3, 5, None), (4, 3, 3)]:
        assert mx.array_equal(ours.create_causal_mask(n, offset, window),
                              ref.create_causal_mask(n, offset, window)).item()
    padding = mx.array([0, 2])
    assert mx.array_equal(ours.create_causal_mask(3, 2, left_padding=padding),
                          ref.create_causal_mask(3, 2, left_padding=padding)).item()
    with pytest.raises(NotImplementedError, match="left-padded"):
        ours.create_causal_mask(3, right_padding=mx.array([1]))
    h = mx.zeros((2, 5, 8))
    assert ours.create_attention_mask(h) == ref.create_attention_mask(h) == "causal"
    assert ours.create_attention_mask(h[:, :1]) is None
    assert mx.array_equal(ours.create_attention_mask(h, window_size=3),
                          ref.create_attention_mask(h, window_size=3)).item()
    q, k, v = (mx.random.normal(s) for s in [(2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)])
    for mask in ("causal", None, ref.create_causal_mask(5, 2)):
        assert mx.allclose(ours.scaled_dot_product_attention(q, k, v, None, 0.3, mask),
                           ref.scaled_dot_product_attention(q, k, v, None, 0.3, mask),
                           atol=1e-5).item()


# ArraysCache, CacheList and ChunkedKVCache work (tests/test_mlx_lm_contract_caches.py),
# BatchKVCache too (tests/test_dropin_caches.py).
@pytest.mark.parametrize("name", ["BatchRotatingKVCache"])
def test_unsupported_cache_classes_name_the_alternative(name):
    from mlx_lm_batched.models import cache

    with pytest.raises(NotImplementedError, match=f"{name} is not supported .*: .*"):
        getattr(cache, name)([0, 1])
