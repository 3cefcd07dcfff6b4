"""Grouped prefill on models with recurrent state (``StateRowsView``): rows of similar
length prefill together, skipping the columns that are padding for their whole group,
and every row still equals that prompt run alone (state, logits, greedy tokens)."""

import numpy as np
import pytest

import mlx_lm_batched.engine.batch_engine as batching
from arch_harness import greedy_tokens, make_prompts
from mlx_lm_batched.engine.kv_budget import cache_layout
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad, plan_prefill_groups
from mlx_lm_batched.models.cache import KVCache, RotatingKVCache, StateCache
from test_arch_minicpm3_minimax import MINIMAX
from test_arch_recurrent import LFM2, MAMBA, QWEN3_NEXT, _load, _states

FAMILIES = {
    "qwen3_next": QWEN3_NEXT,
    "mamba2": dict(MAMBA, num_heads=8, head_dim=16, n_groups=2, chunk_size=8),
    "lfm2": LFM2,
    "minimax": MINIMAX,
}
# Very mixed lengths 1..40 in length order (as batch_generate sorts its rows).
LENGTHS = (1, 1, 2, 3, 5, 8, 9, 12, 17, 25, 33, 38, 40)


class CountingModel:
    """The model, counting the token columns (rows x columns) each call computes."""

    def __init__(self, model):
        self.model, self.calls = model, []
        cache_layout(self)  # the memory check's one-token probe, out of the count
        self.calls.clear()

    def __call__(self, tokens, **kwargs):
        self.calls.append(tokens.shape)
        return self.model(tokens, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def _prefill(model, prompts, **kwargs):
    tokens, padding = left_pad(prompts)
    engine = BatchEngine(model, **kwargs)
    y, logprobs = engine.prefill(tokens, padding)
    return engine, y, logprobs


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param, _load(request.param, FAMILIES[request.param])


def _one_group(monkeypatch):
    """Make the driver prefill every row in one group (what hybrids got before)."""
    monkeypatch.setattr(batching, "plan_prefill_groups", lambda lengths: [(0, len(lengths))])


def test_groups_form_and_rows_equal_one_group_and_solo(family, monkeypatch):
    name, model = family
    prompts = make_prompts(LENGTHS, seed=11)
    counting = CountingModel(model)
    engine, y, logprobs = _prefill(counting, prompts, prefill_step_size=16)
    kinds = {type(c) for c in engine.cache}
    assert StateCache in kinds and kinds <= {StateCache, KVCache}, name
    # Groups formed: the prefill computed the planned groups' columns, far fewer
    # than the one group padded to the longest prompt.
    width, B = max(LENGTHS) - 1, len(LENGTHS)
    lengths = [min(n - 1, width) for n in LENGTHS]
    groups = plan_prefill_groups(lengths)
    assert len(groups) > 1
    planned = sum((b - a) * max(lengths[a:b]) for a, b in groups)
    computed = sum(r * c for r, c in counting.calls[:-1])
    assert computed == planned < 0.6 * B * width, (computed, planned, B * width)
    assert counting.calls[-1] == (B, 1)  # the last column of every row, at once
    assert [c.size for c in engine.cache] == [width + 1] * len(engine.cache)
    states = _states(engine)
    # The same state and logits as the one-group prefill.
    with monkeypatch.context() as m:
        _one_group(m)
        one, one_y, one_lp = _prefill(model, prompts, prefill_step_size=16)
    np.testing.assert_array_equal(np.array(y), np.array(one_y))
    np.testing.assert_allclose(np.array(logprobs), np.array(one_lp), atol=1e-4)
    # States: float32 rounding moves with the rows and chunk boundaries a call sees
    # (MiniMax's lightning blocks): 1e-5 here, 4e-5 against solo in states up to ~80.
    for ours, theirs in zip(states, _states(one)):
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-3, err_msg=name)
    # And each row as that prompt alone. The batch size moves float32 rounding in the
    # one-group prefill too: up to 2e-4 in the logprobs of Qwen3-Next's unpadded
    # 40-token row (random weights of std 0.3 make large activations).
    for i, p in enumerate(prompts):
        solo, solo_y, solo_lp = _prefill(model, [p])
        assert int(y[i]) == int(solo_y[0]), f"{name} row {i}"
        np.testing.assert_allclose(np.array(logprobs[i]), np.array(solo_lp[0]), atol=5e-4,
                                   err_msg=f"{name} row {i}")
        for layer, (ours, theirs) in enumerate(zip(states, _states(solo))):
            for a, b in zip(ours, theirs):
                np.testing.assert_allclose(a[i], b[0], atol=1e-4, rtol=1e-3,
                                           err_msg=f"{name} row {i} layer {layer}")


def test_grouped_equals_one_group_and_decodes_like_solo(family, monkeypatch):
    name, model = family
    prompts = make_prompts(LENGTHS[::-1], seed=12)  # unsorted order: groups still hold
    grouped = greedy_tokens(model, prompts, 6, prefill_step_size=7)
    _, _, lp_grouped = _prefill(model, prompts, prefill_step_size=7)
    _one_group(monkeypatch)
    one = greedy_tokens(model, prompts, 6, prefill_step_size=7)
    _, _, lp_one = _prefill(model, prompts, prefill_step_size=7)
    np.testing.assert_array_equal(grouped, one)
    np.testing.assert_allclose(np.array(lp_grouped), np.array(lp_one), atol=1e-5)
    monkeypatch.undo()
    for i, p in enumerate(prompts):
        solo = greedy_tokens(model, [p], 6)
        np.testing.assert_array_equal(grouped[i], solo[0], err_msg=f"{name} row {i}")


@pytest.mark.parametrize("max_kv_size", [40, 16])
def test_ring_caches_group_while_the_prompt_fits_the_ring(max_kv_size):
    # Ring caches (max_kv_size) have a row view while the prefill does not wrap them
    # (39 columns before the last fit 40 slots); a wrapped ring keeps one group.
    model = _load("qwen3_next", QWEN3_NEXT)
    prompts = make_prompts(LENGTHS, seed=13)
    counting = CountingModel(model)
    engine, y, logprobs = _prefill(counting, prompts, max_kv_size=max_kv_size)
    assert any(type(c) is RotatingKVCache for c in engine.cache)
    B, width = len(LENGTHS), max(LENGTHS) - 1
    computed = sum(r * c for r, c in counting.calls[:-1])
    if max_kv_size > width:
        assert computed < 0.6 * B * width, computed
    else:
        assert counting.calls[0] == (B, width)  # one group padded to the longest prompt
    for i, p in enumerate(prompts):
        _, solo_y, solo_lp = _prefill(model, [p], max_kv_size=max_kv_size)
        assert int(y[i]) == int(solo_y[0]), f"row {i}"
        np.testing.assert_allclose(np.array(logprobs[i]), np.array(solo_lp[0]), atol=5e-4,
                                   err_msg=f"row {i}")
    # Decoding on from the grouped rings (they wrap now) stays equal to solo rows.
    grouped = greedy_tokens(model, prompts, 4, max_kv_size=max_kv_size)
    for i, p in enumerate(prompts):
        solo = greedy_tokens(model, [p], 4, max_kv_size=max_kv_size)
        np.testing.assert_array_equal(grouped[i], solo[0], err_msg=f"row {i}")


def test_server_warm_up_counts_state_per_row_not_per_token(float_dirs, tmp_path):
    # A tiny Qwen3-Next with SmolLM2's tokenizer, served by the server's engine.
    import json
    import shutil
    from types import SimpleNamespace

    from arch_harness import build_hf_model, save_hf_model
    from mlx_lm_batched import load
    from mlx_lm_batched.server.engine import Engine, EngineConfig
    from mlx_lm_batched.server.errors import APIError
    from mlx_lm_batched.server.events import Job

    tok_dir = float_dirs["smollm2"]
    vocab = json.loads((tok_dir / "config.json").read_text())["vocab_size"]
    save_hf_model(build_hf_model("qwen3_next", dict(QWEN3_NEXT, vocab_size=vocab)), tmp_path,
                  "transformers5")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tok_dir / name).exists():
            shutil.copy(tok_dir / name, tmp_path / name)
    model, tokenizer = load(str(tmp_path))
    engine = Engine(model, tokenizer, EngineConfig(max_batch=4))
    engine.warm_up()
    c = QWEN3_NEXT
    full = c["layer_types"].count("full_attention")
    linear = c["layer_types"].count("linear_attention")
    # float32: keys and values of the attention layers, per token.
    assert engine.admission.kv_bytes_per_token == full * c["num_key_value_heads"] * c["head_dim"] * 2 * 4
    # Per row: the conv inputs (kernel - 1 of q, k, v) and the delta-rule state.
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    kernel = getattr(model.args, "linear_conv_kernel_dim")
    conv = (kernel - 1) * (2 * hk * dk + hv * dv)
    assert engine.admission.state_bytes_per_row == linear * (conv + hv * dk * dv) * 4
    # A request reserves both: n rows of (prompt + max_tokens) slots and one state each.
    need = 2 * ((10 + 5) * engine.admission.kv_bytes_per_token + engine.admission.state_bytes_per_row)
    job = Job(SimpleNamespace(params=SimpleNamespace(n=2)), None, None)
    engine.config.max_kv_bytes = need - 1
    with pytest.raises(APIError):
        engine.admission.reserve(job, [[1] * 10], [5])
    engine.config.max_kv_bytes = need
    assert engine.admission.reserve(job, [[1] * 10], [5])
    assert job.reserved == need
    engine.gen.close()
