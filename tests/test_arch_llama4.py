"""Llama 4 (``llama4_text`` and the multimodal ``llama4`` checkpoint's language model)
against transformers on tiny random configs, in both config layouts: chunked
attention (chunks of 4 positions, so prompts and generations cross several),
NoPE layers with attention temperature tuning (``floor_scale`` 4, so the factor
grows within the test lengths), L2 QK-norm, Llama 4's RoPE scaling, MoE layers
(sigmoid scores scaling the expert input, shared expert) between dense layers.
Plus the chunk mask of the one mask path on its own, and the per-layer kinds
(RoPE/NoPE, chunked/full, MoE/dense, cache kind) against transformers' config."""

import mlx.core as mx
import numpy as np
import pytest
from arch_harness import VOCAB, run_family
from transformers import Llama4Config, Llama4TextConfig

from mlx_lm_batched.cache.kv import KVCache
from mlx_lm_batched.cache.rotating import RotatingKVCache
from mlx_lm_batched.layers import masks
from mlx_lm_batched.layers.mlp import MLP
from mlx_lm_batched.layers.moe import InputScaledMoE
from mlx_lm_batched.models import llama4, llama4_text

# Scout's RoPE scaling (llama3 type with equal low/high frequency factors: a step
# between scaled and unscaled frequencies), its context shrunk to the test lengths.
SCOUT_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
              "low_freq_factor": 1.0, "high_freq_factor": 1.0,
              "original_max_position_embeddings": 16}
# Layers 0-2 RoPE + chunked, layer 3 NoPE + full; MoE (top-2) on layers 1 and 3.
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=24, intermediate_size_mlp=96,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256, num_local_experts=4, num_experts_per_tok=2,
            interleave_moe_layer_step=2, attention_chunk_size=4, floor_scale=4, attn_scale=0.5,
            rope_parameters=SCOUT_ROPE)
# Maverick-like text model: no QK-norm, NoPE every other layer, top-1 MoE on every
# layer, llama3 scaling with a smooth band between low and high frequencies.
MAVERICK_TEXT = dict(TEXT, use_qk_norm=False, no_rope_layer_interval=2,
                     interleave_moe_layer_step=1, num_experts_per_tok=1,
                     rope_parameters=dict(SCOUT_ROPE, factor=8.0, high_freq_factor=4.0))
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              image_size=28, patch_size=14, vision_output_dim=32, projector_input_dim=32,
              projector_output_dim=64)
LENGTHS = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}

FAMILIES = {
    "llama4_text": (TEXT, LENGTHS),
    "llama4": (dict(text_config=MAVERICK_TEXT, vision_config=VISION), LENGTHS),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_llama4_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def brute_force_chunk_mask(length, chunk):
    """Causal attention within chunks of ``chunk`` positions, position by position."""
    return np.array([[k <= q and k // chunk == q // chunk for k in range(length)]
                     for q in range(length)])


def test_chunk_mask_counts_each_rows_positions_from_its_first_token():
    """A left-padded row's chunks start at its first real token: its mask over its
    real columns equals the row's mask alone, and the brute-force chunk rule."""
    chunk, lengths = 3, (8, 5, 1)
    L = max(lengths)
    pads = [L - n for n in lengths]
    batch = np.array(masks.causal_mask(L, mx.array([-p for p in pads]), chunk=chunk))
    for b, (n, pad) in enumerate(zip(lengths, pads)):
        alone = np.array(masks.causal_mask(n, mx.array([0]), chunk=chunk))[0, 0]
        np.testing.assert_array_equal(batch[b, 0, pad:, pad:], alone)
        np.testing.assert_array_equal(alone, brute_force_chunk_mask(n, chunk))
        assert not batch[b, 0, pad:, :pad].any()  # real queries never see padding
    # With a window as well, both limits apply.
    both = np.array(masks.causal_mask(8, mx.array([0]), window=2, chunk=3))[0, 0]
    q, k = np.indices((8, 8))
    np.testing.assert_array_equal(both, brute_force_chunk_mask(8, 3) & (q - k < 2))


def test_chunk_mask_after_cached_slots():
    """Decode steps over a cache: the query at position p sees the positions of its
    chunk up to p, per row, whatever the row's padding."""
    chunk, before = 4, 9
    offset = mx.array([9, 6, 2])  # real tokens cached per row (padding 0, 3, 7)
    mask = np.array(masks.attention_mask(mx.arange(before + 1), before, 1, offset,
                                         chunk=chunk))[:, 0, 0]
    for b, n in enumerate([9, 6, 2]):
        pad = before - n
        seen = [s - pad for s in range(before + 1) if mask[b, s]]
        assert seen == list(range(n - n % chunk, n + 1)), b


def test_layer_kinds_follow_transformers_config():
    """Per-layer RoPE/NoPE, chunk, QK-norm, query temperature, MoE/dense and cache
    kind of the default Scout-sized configs (built lazily) follow transformers'."""
    for config_class, module in ((Llama4TextConfig, llama4_text), (Llama4Config, llama4)):
        config = config_class()
        text = config.get_text_config()
        model = module.Model(module.ModelArgs.from_dict(config.to_dict()))
        caches = model.make_cache()
        for i, layer in enumerate(model.layers):
            use_rope = bool(text.no_rope_layers[i])
            attn = layer.self_attn
            assert (attn.rope is not None) == use_rope, i
            assert attn.has_qk_norm == (use_rope and text.use_qk_norm), i
            assert (attn.position_scale is not None) == (not use_rope), i
            chunked = text.layer_types[i] == "chunked_attention"
            assert model.layer_chunks[i] == (text.attention_chunk_size if chunked else None), i
            if chunked:
                assert isinstance(caches[i], RotatingKVCache)
                assert caches[i].max_size == text.attention_chunk_size
            else:
                assert type(caches[i]) is KVCache
            moe = i in text.moe_layers
            assert isinstance(layer.feed_forward, InputScaledMoE if moe else MLP), i
        assert model.args.rope_theta == text.rope_parameters["rope_theta"]


def test_temperature_tuning_factor():
    """The NoPE query factor: 1 until position floor_scale - 1, then
    1 + attn_scale * log(1 + floor((p + 1) / floor_scale))."""
    scale = llama4_text.temperature_scale(0.1, 8192)
    positions = mx.array([[0, 8190, 8191, 3 * 8192 - 1]])
    expected = [1.0, 1.0, 1 + 0.1 * np.log(2), 1 + 0.1 * np.log(4)]
    np.testing.assert_allclose(np.array(scale(positions))[0], expected, rtol=1e-6)


def test_max_kv_size_bounds_every_layer():
    args = llama4_text.ModelArgs.from_dict(dict(TEXT, model_type="llama4_text",
                                                rope_parameters=None))
    caches = llama4_text.Model(args).make_cache(max_kv_size=3)
    assert [c.max_size for c in caches] == [3, 3, 3, 3]
    caches = llama4_text.Model(args).make_cache(max_kv_size=64)
    assert [getattr(c, "max_size", None) for c in caches] == [4, 4, 4, 64]


def test_4bit_conversion_of_the_multimodal_checkpoint_batches_exactly(tmp_path):
    """``convert --quantize`` of the multimodal checkpoint writes the language model
    only (vision weights dropped, experts quantized) and the loaded 4-bit model gives
    each padded row the logits and greedy tokens of that prompt alone."""
    from arch_harness import build_hf_model, greedy_tokens, make_prompts, save_hf_model
    from safetensors import safe_open

    from mlx_lm_batched.convert import convert
    from mlx_lm_batched.engine.prefill_plan import left_pad
    from mlx_lm_batched.layers.moe import QuantizedSwitchLinear
    from mlx_lm_batched.utils import load_model

    config, _ = FAMILIES["llama4"]
    save_hf_model(build_hf_model("llama4", config), tmp_path / "hf", "transformers5")
    convert(tmp_path / "hf", tmp_path / "q4", quantize=True, q_group_size=32, q_bits=4)
    names = []
    for path in (tmp_path / "q4").glob("*.safetensors"):
        with safe_open(str(path), "numpy") as f:
            names += list(f.keys())
    assert names and not any("vision" in n or "projector" in n for n in names)
    model, cfg = load_model(tmp_path / "q4")
    assert cfg["quantization"]["bits"] == 4
    # (down_proj's 24 inputs are no whole number of groups of 32: it stays float.)
    assert isinstance(model.layers[0].feed_forward.experts.gate_proj, QuantizedSwitchLinear)

    prompts = make_prompts((5, 30, 1, 17), seed=3)
    tokens, padding = left_pad(prompts)
    logits = model(tokens, offset=mx.array([-p for p in padding]))
    for i, p in enumerate(prompts):
        solo = model(mx.array([p]))[0]
        np.testing.assert_allclose(np.array(logits[i, padding[i]:]), np.array(solo),
                                   atol=1e-4, rtol=1e-4, err_msg=f"row {i} logits")
    batch = greedy_tokens(model, prompts, 12)
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(batch[i], greedy_tokens(model, [p], 12)[0],
                                      err_msg=f"row {i}")


def test_mlx_lm_converted_names_load():
    """mlx-lm's converted Llama 4 checkpoints keep the ``language_model.`` prefix and
    stacked expert weights (``experts.gate_proj.weight``): they map onto ours."""
    from mlx.utils import tree_flatten

    config = dict(model_type="llama4", text_config=MAVERICK_TEXT, vision_config=VISION)
    model = llama4.Model(llama4.ModelArgs.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    assert "model.layers.0.feed_forward.experts.gate_proj.weight" in params
    converted = {f"language_model.{k}": v for k, v in params.items()}
    converted["vision_model.patch_embedding.linear.weight"] = mx.zeros((32, 588))
    ours = model.sanitize(converted)
    assert sorted(ours) == sorted(params)
    assert all(ours[k] is params[k] for k in params)
