"""The memory budget counts key/value slots and per-row recurrent state: its layout
(probed lazily from one token) equals what a real prefill stores, and a hybrid or
state-space batch that cannot fit is refused before it starts, like a KV batch."""

import json

import mlx.core as mx
import pytest

from mlx_lm_batched.engine import kv_budget
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.generate import generate_step
from mlx_lm_batched.models import get_model_module
from mlx_lm_batched.models.cache import StateCache, make_prompt_cache

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)
CONFIGS = {
    # Linear attention with a big state (8 heads of 32x32), one small attention layer:
    # a row's state outweighs its key/value slots for short generations.
    "qwen3_next": dict(BASE, num_hidden_layers=2, head_dim=8, num_key_value_heads=1,
                       layer_types=["linear_attention", "full_attention"],
                       linear_num_value_heads=8, linear_num_key_heads=4,
                       linear_key_head_dim=32, linear_value_head_dim=32, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48),
    # Two caches per layer (attention and Mamba-2 side by side).
    "falcon_h1": dict(BASE, num_hidden_layers=2, mamba_d_ssm=64, mamba_n_heads=8,
                      mamba_d_head=8, mamba_n_groups=2, mamba_d_state=8),
    # State only: no key/value cache at all.
    "mamba": dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, state_size=8),
}


def tiny(model_type):
    mx.random.seed(0)
    module = get_model_module(model_type)
    model = module.Model(module.ModelArgs.from_dict(dict(CONFIGS[model_type],
                                                         model_type=model_type)))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_layout_equals_what_a_prefill_stores(model_type):
    model = tiny(model_type)
    layout = kv_budget.cache_layout(model)
    assert kv_budget.cache_layout(model) is layout  # probed once per model
    tokens, padding = left_pad([[5, 6, 7, 8, 9, 10, 11], [3, 4], [12, 13, 14, 15]])
    engine = BatchEngine(model)
    engine.prefill(tokens, padding)
    rows, state_total = 3, 0
    assert len(layout) == len(engine.cache)
    for (per_slot, fixed), c in zip(layout, engine.cache):
        if isinstance(c, StateCache):
            assert per_slot == 0 and c.nbytes == rows * fixed > 0
            state_total += c.nbytes
        else:
            assert fixed == 0 and c.nbytes == rows * c.keys.shape[2] * per_slot
    kv, state = kv_budget.cache_bytes(model, engine.cache, rows, 100)
    assert state == state_total
    assert kv == 100 * rows * sum(per_slot for per_slot, _ in layout)
    assert (kv == 0) == (model_type == "mamba")


def test_layout_of_a_real_model(float_dirs, float_models):
    model, _ = float_models["smollm2"]
    cfg = json.loads((float_dirs["smollm2"] / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_slot = 2 * cfg["num_key_value_heads"] * head_dim * 4  # keys and values, float32
    assert kv_budget.cache_layout(model) == ((per_slot, 0),) * cfg["num_hidden_layers"]
    # Rotating caches hold at most their ring.
    cache = make_prompt_cache(model, max_kv_size=64)
    kv, state = kv_budget.cache_bytes(model, cache, 2, 1000)
    assert (kv, state) == (2 * 64 * per_slot * cfg["num_hidden_layers"], 0)


def start(model, rows, max_tokens=4):
    prompts = mx.array([[5 + r, 6, 7, 8, 9] for r in range(rows)])
    return next(generate_step(prompts, model, max_tokens=max_tokens))


@pytest.mark.parametrize("model_type", ["qwen3_next", "mamba"])
def test_state_batch_that_cannot_fit_is_refused_up_front(model_type, monkeypatch):
    model = tiny(model_type)
    rows = 4
    kv_max, state = kv_budget.cache_bytes(model, make_prompt_cache(model), rows, 256)
    # 256 slots (the ring ahead) bound what these 5-token prompts reserve: key/value
    # bytes alone stay under the state, so only a budget counting the state refuses.
    assert kv_max < state
    monkeypatch.setattr(kv_budget, "available_memory", lambda: state - 1)
    what = "KV cache and recurrent state" if model_type == "qwen3_next" else "recurrent state"
    with pytest.raises(ValueError, match=f"{what} \\({rows} rows x .*lower "
                       f"{'max_tokens or ' if kv_max else ''}the batch size"):
        start(model, rows)
    # One row fewer fits (the state is per row), and so does the batch with room for it.
    monkeypatch.setattr(kv_budget, "available_memory", lambda: kv_max + state)
    tokens, _ = start(model, rows)
    assert tokens.shape == (rows,)
    monkeypatch.setattr(kv_budget, "available_memory", lambda: (kv_max + state) * (rows - 1) // rows)
    assert start(model, rows - 1)[0].shape == (rows - 1,)
