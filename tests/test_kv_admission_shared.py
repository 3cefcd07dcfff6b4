"""The KV bound does not reserve what rows read from shared KV blocks (``server/kv_admission.py``
with the engine's block store), on the real SmolLM2: a prompt reserves its full length before
its prefix is stored and only its own tokens after; a request that scores its prompt (echo
with logprobs) reuses nothing and reserves all of it. A request starts only beside the cache
bytes the batch still holds for finished rows (their reservations are released first)."""

from types import SimpleNamespace

from conftest import model_dir
from mlx_lm_batched import load
from mlx_lm_batched.server.engine import Engine
from mlx_lm_batched.server.events import EngineConfig, Job
from test_kv_blocks import B, generate, smol, text  # noqa: F401  (smol: the fixture)


def job(**params):
    return Job(SimpleNamespace(params=SimpleNamespace(n=1, **params), adapter=0), None, None)


def test_cached_prefix_blocks_are_not_reserved(smol):  # noqa: F811
    model, ids = smol
    _, tokenizer = load(str(model_dir("smollm2", dtype="float32")))
    engine = Engine(model, tokenizer, EngineConfig(max_batch=4))
    engine.warm_up()
    per_token = engine.admission.kv_bytes_per_token
    prompt = text(ids, 8 * B + 5, 100)
    cold = job()
    assert engine.admission.reserve(cold, [prompt], [4])
    assert cold.reserved == (len(prompt) + 4) * per_token
    engine.admission.release(cold)
    _, _, cache, tokens = generate(model, prompt, n=1)  # a finished row's cache, stored
    engine.prefix.insert_cache(model, tokens, cache)
    warm, scored = job(), job(echo=True, logprobs=1)
    assert engine.admission.reserve(warm, [prompt], [4])
    assert warm.reserved == (len(prompt) - 8 * B + 4) * per_token
    assert engine.admission.reserve(scored, [prompt], [4])
    assert scored.reserved == (len(prompt) + 4) * per_token
    engine.gen.close()


def test_a_request_waits_for_the_cache_finished_rows_still_hold(smol):  # noqa: F811
    model, ids = smol
    _, tokenizer = load(str(model_dir("smollm2", dtype="float32")))
    engine = Engine(model, tokenizer, EngineConfig(max_batch=4))
    engine.warm_up()
    gen = engine.gen
    gen.insert([text(ids, 300, 0), text(ids, 300, 400), text(ids, 300, 800)],
               max_tokens=[2, 3, 3])
    for _ in range(20):  # until the first row finished while the others go on (one
        gen.next()       # token left each: dropping it would not pay yet)
        if gen.finished_nbytes:
            break
    held = gen.finished_nbytes
    assert 0.2 * gen.prompt_cache_nbytes < held < 0.5 * gen.prompt_cache_nbytes
    prompt = text(ids, 100, 1500)
    need = (len(prompt) + 4) * engine.admission.kv_bytes_per_token
    engine.config.max_kv_bytes = need + held // 2  # fits alone, not beside the held bytes
    assert not engine.admission.reserve(job(), [prompt], [4])
    engine.config.max_kv_bytes = need + held
    assert engine.admission.reserve(job(), [prompt], [4])
    gen.close()
