"""Quantized KV caches (``kv_bits``): single streams equal mlx-lm's quantized results,
a row of a quantized batch equals the prompt alone (also with sliding windows, rows
joining mid-decode, and caches quantized on one side only), files move both ways
between the libraries, and the caches hold the quantized bytes."""

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.generate import generate_step as lm_generate_step
from mlx_lm.models import cache as lm_cache

from conftest import corpus_prompts
from mlx_lm_batched import batch_generate
from mlx_lm_batched.cache.quantized import QuantizedKVCache
from mlx_lm_batched.generate import BatchGenerator, generate_step
from mlx_lm_batched.models.cache import load_prompt_cache, make_prompt_cache, save_prompt_cache

TOL = 1e-4  # float32 accumulation order (see the README); measured <= 5e-5
# Against mlx-lm at 8 bits: the two libraries' float keys differ in the last bits (their
# kernels sum in another order), which moves a few of 8-bit quantization's finer rounding
# steps (451 of 1.5M key values here, none at 4 bits); measured 0.058 logprob.
TOL_8BIT_MLX_LM = 0.1
# A row in a batch and alone, every matmul through our row-invariant kernel
# (``row_invariant_matmuls``): float results differ only where attention sums over other
# key lengths; where that moves a key across a 4-bit rounding step, the value moves by one
# step. Measured: 0 mostly, 0.005 for one row of the ring case. (With the BLAS serving the
# batch's prefill, MKL on an AVX2 AMD EPYC moves a Gemma 3 key a step and the row's second
# token changes: logprobs 0.03-0.8 apart. That is the platform's kernel, not the cache.)
TOL_BATCH_4BIT = 0.02


@pytest.fixture(scope="module")
def lm_smol(float_dirs):
    return mlx_lm.load(str(float_dirs["smollm2"]))[0]


def run(step_iter):
    out = list(step_iter)
    return [t for t, _ in out], [lp for _, lp in out]


def max_diff(a, b):
    return max(float(mx.abs(x - y).max()) for x, y in zip(a, b))


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32)])
def test_single_stream_equals_mlx_lm(float_models, lm_smol, bits, group):
    model, tok = float_models["smollm2"]
    lm_model = lm_smol
    prompt = mx.array(corpus_prompts(tok, [14])[0])
    kw = dict(max_tokens=4, kv_bits=bits, kv_group_size=group, quantized_kv_start=4)
    ours = run(generate_step(prompt, model, **kw))
    ref = run(lm_generate_step(prompt, lm_model, **kw))
    floats = run(generate_step(prompt, model, max_tokens=4))
    assert ours[0] == ref[0]
    assert max_diff(ours[1], ref[1]) < (TOL if bits == 4 else TOL_8BIT_MLX_LM)
    assert max_diff(ours[1], floats[1]) > 10 * TOL  # the quantization really acts


@pytest.mark.parametrize("name,max_kv_size", [("smollm2", None), ("gemma3", None),
                                              ("smollm2", 8)])
def test_batch_rows_equal_alone(float_models, row_invariant_matmuls, name, max_kv_size):
    model, tok = float_models[name]
    prompts = corpus_prompts(tok, [5, 17, 10])
    kw = dict(kv_bits=4, quantized_kv_start=0, max_tokens=5, max_kv_size=max_kv_size,
              return_token_ids=True, return_logprobs=True)
    batch = batch_generate(model, tok, prompts, **kw)
    for i, p in enumerate(prompts):
        alone = batch_generate(model, tok, [p], **kw)
        assert batch.token_ids[i] == alone.token_ids[0]
        diff = max(abs(a - b) for a, b in zip(batch.logprobs[i], alone.logprobs[0]))
        assert diff < TOL_BATCH_4BIT


def test_rows_join_mid_decode(float_models):
    # quantized_kv_start=9: the running batch is quantized when the short newcomer joins,
    # still float (the join quantizes it).
    model, tok = float_models["smollm2"]
    start = 9
    first, second = corpus_prompts(tok, [12, 4])

    def tokens(schedule):
        gen = BatchGenerator(model, max_tokens=4, kv_bits=4, quantized_kv_start=start,
                             return_caches=False)
        out, uids = {}, {}
        for step in range(40):
            for k, p in schedule.get(step, []):
                uids[gen.insert([p])[0]] = k
            responses = gen.next_generated()
            if not responses and step > max(schedule):
                break
            for r in responses:
                out.setdefault(uids[r.uid], []).append(r.token)
        return out

    joined = tokens({0: [("a", first)], 2: [("b", second)]})
    assert joined["a"] == tokens({0: [("a", first)]})["a"]
    assert joined["b"] == tokens({0: [("b", second)]})["b"]


def test_files_both_ways_and_quantized_bytes(float_models, lm_smol, tmp_path):
    model, tok = float_models["smollm2"]
    lm_model = lm_smol
    prompt = mx.array(corpus_prompts(tok, [9])[0])
    kw = dict(kv_bits=4, kv_group_size=64, quantized_kv_start=0)
    # mlx-lm's quantized cache file continues here as it does in mlx-lm.
    theirs = lm_cache.make_prompt_cache(lm_model)
    list(lm_generate_step(prompt, lm_model, max_tokens=2, prompt_cache=theirs, **kw))
    path = str(tmp_path / "theirs.safetensors")
    lm_cache.save_prompt_cache(path, theirs)
    loaded = load_prompt_cache(path)
    assert isinstance(loaded[0], QuantizedKVCache) and loaded[0].size == 11
    nxt = mx.array([42])
    ours = run(generate_step(nxt, model, max_tokens=3, prompt_cache=loaded, **kw))
    ref = run(lm_generate_step(nxt, lm_model, max_tokens=3, prompt_cache=theirs, **kw))
    assert ours[0] == ref[0] and max_diff(ours[1], ref[1]) < TOL
    # Ours, saved, loads in mlx-lm and continues as ours does.
    mine = make_prompt_cache(model)
    list(generate_step(prompt, model, max_tokens=2, prompt_cache=mine, **kw))
    path = str(tmp_path / "ours.safetensors")
    save_prompt_cache(path, mine)
    lm_loaded = lm_cache.load_prompt_cache(path)
    assert type(lm_loaded[0]).__name__ == "QuantizedKVCache" and lm_loaded[0].offset == 11
    ref = run(lm_generate_step(nxt, lm_model, max_tokens=3, prompt_cache=lm_loaded, **kw))
    ours = run(generate_step(nxt, model, max_tokens=3, prompt_cache=mine, **kw))
    assert ours[0] == ref[0] and max_diff(ours[1], ref[1]) < TOL
    # 4-bit keys/values with a scale and bias per 64: 4 + 2 * 32 / 64 = 5 bits per value.
    floats = make_prompt_cache(model)
    list(generate_step(prompt, model, max_tokens=2, prompt_cache=floats))
    per_slot = lambda cache: sum(x.nbytes for c in cache for x in c.state) / cache[0].size  # noqa: E731
    ratio = per_slot(mine) / per_slot(floats)
    assert 0.1 < ratio < 5 / 32 + 0.02


def test_quantized_ring_rows_extract_and_save(float_models, tmp_path):
    model, tok = float_models["smollm2"]
    prompts = corpus_prompts(tok, [11, 4])
    kw = dict(kv_bits=8, kv_group_size=32, quantized_kv_start=0, max_kv_size=6,
              max_tokens=3, return_token_ids=True)
    first = batch_generate(model, tok, prompts, return_prompt_caches=True, **kw)
    for i, cache in enumerate(first.caches):
        assert isinstance(cache[0], QuantizedKVCache) and cache[0].max_size == 6
        path = str(tmp_path / f"row{i}.safetensors")
        save_prompt_cache(path, cache)
        again = batch_generate(model, tok, [[7, 8]], prompt_caches=[load_prompt_cache(path)], **kw)
        direct = batch_generate(model, tok, [[7, 8]], prompt_caches=[cache], **kw)
        assert again.token_ids == direct.token_ids


def test_bad_kv_bits_is_one_line(float_models):
    model, tok = float_models["smollm2"]
    with pytest.raises(ValueError, match="kv_bits must be one of"):
        list(generate_step(mx.array([1, 2]), model, kv_bits=7))
    with pytest.raises(ValueError, match="kv_group_size must be one of"):
        batch_generate(model, tok, [[1, 2]], kv_bits=4, kv_group_size=48)
