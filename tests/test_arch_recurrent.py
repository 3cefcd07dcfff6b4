"""Recurrent-state families (state caches) against transformers on tiny random
configs, plus the checks the harness cannot see: each row's *state* in a padded batch
equals the row alone, chunked prefill equals one pass, rows joining a running
``BatchGenerator`` equal solo, and saved/loaded caches continue exactly."""

import tempfile

import mlx.core as mx
import numpy as np
import pytest

from arch_harness import (BASE_SMALL, VOCAB, build_hf_model, check_architecture, greedy_tokens,
                          make_prompts, save_hf_model)
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.generate import BatchGenerator, generate_step
from mlx_lm_batched.models.cache import StateCache, load_prompt_cache, save_prompt_cache
from mlx_lm_batched.utils import load_model

MAMBA = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=8,
             tie_word_embeddings=False)
LFM2 = dict(BASE_SMALL, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
            block_multiple_of=16)
GRANITE_HYBRID = dict(BASE_SMALL, num_hidden_layers=3, intermediate_size=32,
                      shared_intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                      mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=2,
                      layer_types=["mamba", "attention", "mamba"], position_embedding_type="rope",
                      embedding_multiplier=2.0, residual_multiplier=0.5,
                      attention_multiplier=0.2, logits_scaling=3.0)
RECURRENT_GEMMA = dict(BASE_SMALL, num_hidden_layers=3, head_dim=16, attention_window_size=8)
FALCON_H1 = dict(BASE_SMALL, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2,
                 mamba_d_state=8, lm_head_multiplier=0.5, embedding_multiplier=2.0,
                 mlp_multipliers=[0.7, 1.3], key_multiplier=0.8, attention_out_multiplier=0.9,
                 attention_in_multiplier=1.1, ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9],
                 ssm_in_multiplier=1.2, ssm_out_multiplier=0.6)
KIMI_LINEAR = dict(BASE_SMALL, num_hidden_layers=3, num_key_value_heads=4,
                   layer_types=["linear_attention", "full_attention", "linear_attention"],
                   mlp_layer_types=["dense", "sparse", "sparse"], moe_intermediate_size=32,
                   num_experts=4, num_experts_per_token=2, kv_lora_rank=16, qk_rope_head_dim=8,
                   qk_nope_head_dim=16, v_head_dim=16, linear_head_dim=16, linear_num_heads=4,
                   routed_scaling_factor=1.5, pad_token_id=0, bos_token_id=1, eos_token_id=2)
JAMBA = dict(BASE_SMALL, num_hidden_layers=4, num_experts=4, num_experts_per_tok=2,
             attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
             expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8)
LFM2_MOE = dict(BASE_SMALL, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
                moe_intermediate_size=32, num_dense_layers=1, num_experts=4, num_experts_per_tok=2)
QWEN3_NEXT = dict(BASE_SMALL, num_hidden_layers=4, head_dim=16, moe_intermediate_size=32,
                  shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                  linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                  linear_value_head_dim=8, mlp_only_layers=[1],
                  layer_types=["linear_attention", "full_attention"] * 2)
QWEN3_5 = dict(BASE_SMALL, num_hidden_layers=4, head_dim=16, linear_num_value_heads=4,
               linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
               layer_types=["linear_attention", "full_attention"] * 2)
QWEN3_5_MOE = dict(QWEN3_5, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                   num_experts=4, num_experts_per_tok=2)
NEMOTRON_H = dict(BASE_SMALL, head_dim=16, mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=8,
                  n_groups=2, layers_block_type=["linear_attention", "full_attention", "mlp", "moe"],
                  n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  moe_shared_expert_intermediate_size=48, n_group=1, topk_group=1)

# model_type -> (config kwargs, extra check options). ``layouts``: the config layouts
# that differ for the family (no RoPE settings: one layout only).
FAMILIES = {
    "mamba": (MAMBA, {"layouts": ("transformers5",)}),
    "mamba-tied": (dict(MAMBA, tie_word_embeddings=True, conv_kernel=3),
                   {"model_type": "mamba", "layouts": ("transformers5",)}),
    "falcon_mamba": (MAMBA, {"layouts": ("transformers5",)}),
    "granitemoehybrid": (GRANITE_HYBRID, {}),
    "granitemoehybrid-nope": (dict(GRANITE_HYBRID, position_embedding_type=None),
                              {"model_type": "granitemoehybrid", "layouts": ("transformers5",)}),
    "recurrent_gemma": (RECURRENT_GEMMA, {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}),
    "falcon_h1": (FALCON_H1, {}),
    "falcon_h1-gated-norm": (dict(FALCON_H1, mamba_rms_norm=True, mamba_norm_before_gate=False),
                             {"model_type": "falcon_h1", "layouts": ("transformers5",)}),
    "kimi_linear": (KIMI_LINEAR, {"layouts": ("transformers5",)}),
    "jamba": (JAMBA, {"layouts": ("transformers5",)}),
    "lfm2": (LFM2, {}),
    "lfm2_moe": (LFM2_MOE, {}),
    "qwen3_next": (QWEN3_NEXT, {}),
    "nemotron_h": (NEMOTRON_H, {"layouts": ("transformers5",)}),
    "qwen3_5_text": (QWEN3_5, {}),
    "qwen3_5_moe_text": (QWEN3_5_MOE, {}),
    # The multimodal model_types load a flat text config saved under their name too (their
    # nested checkpoint layout: test_qwen3_5_multimodal_checkpoint_layout below).
    "qwen3_5-flat": (QWEN3_5, {"model_type": "qwen3_5_text", "saved_model_type": "qwen3_5"}),
    "qwen3_5_moe-flat": (QWEN3_5_MOE, {"model_type": "qwen3_5_moe_text",
                                       "saved_model_type": "qwen3_5_moe"}),
    "mamba2": (dict(MAMBA, num_heads=8, head_dim=16, n_groups=2, chunk_size=8),
               {"layouts": ("transformers5",)}),
}

CASES = [(name, layout) for name, (_, opts) in sorted(FAMILIES.items())
         for layout in opts.get("layouts", ("transformers4", "transformers5"))]


@pytest.mark.parametrize("name, layout", CASES)
def test_family_matches_transformers_and_batches_exactly(name, layout):
    config, options = FAMILIES[name]
    options = dict(options)
    options.pop("layouts", None)
    model_type = options.pop("model_type", name)
    check_architecture(model_type, config, layout=layout, **options)


def _load(model_type, config):
    hf = build_hf_model(model_type, config)
    with tempfile.TemporaryDirectory() as d:
        save_hf_model(hf, d, "transformers5")
        return load_model(d)[0]


@pytest.fixture(scope="module")
def mamba():
    return _load("mamba", MAMBA)


@pytest.fixture(scope="module")
def lfm2():
    return _load("lfm2", LFM2)


@pytest.fixture(scope="module")
def recurrent_gemma():
    return _load("recurrent_gemma", RECURRENT_GEMMA)


@pytest.fixture(scope="module")
def falcon_h1():
    return _load("falcon_h1", FALCON_H1)


@pytest.fixture(scope="module")
def kimi_linear():
    return _load("kimi_linear", KIMI_LINEAR)


@pytest.fixture(scope="module")
def qwen3_next():
    return _load("qwen3_next", QWEN3_NEXT)


def _prefill(model, prompts, **kwargs):
    tokens, padding = left_pad(prompts)
    engine = BatchEngine(model, **kwargs)
    y, logprobs = engine.prefill(tokens, padding)
    return engine, y, logprobs


def _states(engine):
    return [[np.array(a) for a in c.arrays] for c in engine.cache if isinstance(c, StateCache)]


@pytest.mark.parametrize("family", ["mamba", "lfm2", "qwen3_next", "recurrent_gemma",
                                    "falcon_h1", "kimi_linear"])
def test_padded_rows_state_equals_row_alone(family, request):
    model = request.getfixturevalue(family)
    # Very different lengths: the short rows are mostly padding.
    prompts = make_prompts((41, 2, 17, 1), seed=5)
    engine, _, logprobs = _prefill(model, prompts, prefill_step_size=8)
    assert any(isinstance(c, StateCache) for c in engine.cache)
    batch = _states(engine)
    for i, p in enumerate(prompts):
        solo, _, solo_lp = _prefill(model, [p])
        for layer, (ours, theirs) in enumerate(zip(batch, _states(solo))):
            for a, b in zip(ours, theirs):
                np.testing.assert_allclose(a[i], b[0], atol=1e-5, rtol=1e-5,
                                           err_msg=f"row {i} layer {layer}")
        np.testing.assert_allclose(np.array(logprobs[i]), np.array(solo_lp[0]), atol=1e-4)


def test_chunked_prefill_equals_one_pass(mamba):
    prompts = make_prompts((30, 9), seed=6)
    one, _, lp_one = _prefill(mamba, prompts, prefill_step_size=512)
    chunked, _, lp_chunked = _prefill(mamba, prompts, prefill_step_size=4)
    for a_layer, b_layer in zip(_states(one), _states(chunked)):
        for a, b in zip(a_layer, b_layer):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.array(lp_one), np.array(lp_chunked), atol=1e-4)


def _solo_tokens(model, prompt, n):
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=n)]


@pytest.mark.parametrize("family", ["mamba", "lfm2", "falcon_h1"])
def test_rows_joining_generator_match_solo(family, request):
    model = request.getfixturevalue(family)
    n = 8
    prompts = make_prompts((23, 3, 11), seed=7)
    gen = BatchGenerator(model, max_tokens=n, prefill_step_size=8)
    joins = {0: [0], 3: [1], 5: [2]}
    out, uids, calls = {}, {}, 0
    while calls < 200:
        for i in joins.pop(calls, []):
            (uids[i],) = gen.insert([prompts[i]])
            out[uids[i]] = []
        _, responses = gen.next()
        calls += 1
        for r in responses:
            out[r.uid].append(int(r.token))
        if not joins and all(len(t) == n for t in out.values()):
            break
    for i, p in enumerate(prompts):
        assert out[uids[i]] == _solo_tokens(model, p, n), f"{family} row {i}"


@pytest.mark.parametrize("family", ["mamba", "lfm2"])
def test_save_load_padded_batch_continues_exactly(family, request, tmp_path):
    model = request.getfixturevalue(family)
    prompts = make_prompts((13, 4, 8), seed=8)
    engine, y, _ = _prefill(model, prompts)
    path = str(tmp_path / "state.safetensors")
    save_prompt_cache(path, engine.cache)
    loaded = load_prompt_cache(path)
    assert loaded.padding == engine.cache.padding
    assert [c.size for c in loaded] == [c.size for c in engine.cache]
    assert loaded.nbytes == engine.cache.nbytes > 0
    assert not loaded[0].is_trimmable() and loaded.trim(1) == 0
    # mlx-lm reads the file as its ArraysCache (same arrays), and we read its files.
    from mlx_lm.models import cache as mlx_lm_cache
    theirs = mlx_lm_cache.load_prompt_cache(path)
    assert type(theirs[0]).__name__ == "ArraysCache"
    for ours, other in zip(engine.cache, theirs):
        for a, b in zip(ours.state, other.state[0] if isinstance(ours, StateCache) else other.state):
            assert mx.array_equal(a, b)
    mlx_lm_cache.save_prompt_cache(str(tmp_path / "mlx_lm.safetensors"), theirs)
    back = load_prompt_cache(str(tmp_path / "mlx_lm.safetensors"))
    assert all(mx.array_equal(a, b) for c, d in zip(back, engine.cache)
               for a, b in zip(c.state, d.state))
    again = BatchEngine(model, prompt_cache=loaded)
    y1, y2 = y, y
    for _ in range(5):
        (y1, lp1), (y2, lp2) = engine.step(y1), again.step(y2)
        np.testing.assert_array_equal(np.array(y1), np.array(y2))
        np.testing.assert_allclose(np.array(lp1), np.array(lp2), atol=1e-5)


@pytest.mark.parametrize("family", ["mamba", "lfm2", "qwen3_next"])
def test_second_turn_with_padding_equals_row_alone(family, request):
    model = request.getfixturevalue(family)
    # A later turn whose rows add different numbers of tokens: pad columns follow
    # cached tokens and must not move the rows' convolution windows or SSM state.
    first = make_prompts((9, 3), seed=9)
    second = make_prompts((2, 7), seed=10)
    engine, _, _ = _prefill(model, first)
    tokens, padding = left_pad(second)
    _, logprobs = engine.prefill(tokens, padding)
    for i in range(2):
        solo, _, _ = _prefill(model, [first[i]])
        _, solo_lp = solo.prefill(mx.array([second[i]]))
        np.testing.assert_allclose(np.array(logprobs[i]), np.array(solo_lp[0]), atol=1e-4)
        for ours, theirs in zip(_states(engine), _states(solo)):
            for a, b in zip(ours, theirs):
                np.testing.assert_allclose(a[i], b[0], atol=1e-5, rtol=1e-5, err_msg=f"row {i}")


def test_nemotron_h_reads_hub_pattern_and_max_kv_size(tmp_path):
    from mlx_lm_batched.models.nemotron_h import ModelArgs
    hub = ModelArgs.from_dict(dict(model_type="nemotron_h", vocab_size=VOCAB, hidden_size=64,
                                   hybrid_override_pattern="M*-E"))
    assert hub.layers_block_type == ["mamba", "attention", "mlp", "moe"]
    assert hub.num_hidden_layers == 4
    with pytest.raises(ValueError, match="layers_block_type or hybrid_override_pattern"):
        ModelArgs.from_dict(dict(model_type="nemotron_h", vocab_size=VOCAB, hidden_size=64))
    # A ring-limited attention cache next to state caches: rows still equal solo.
    model = _load("nemotron_h", NEMOTRON_H)
    prompts = make_prompts((19, 5), seed=11)
    batch = greedy_tokens(model, prompts, 6, max_kv_size=8)
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(batch[i], greedy_tokens(model, [p], 6, max_kv_size=8)[0])


def test_lfm2_moe_expert_bias_matches_transformers():
    # The harness leaves ``expert_bias`` at zero; a random one must move the choice
    # of experts exactly as transformers does.
    import torch
    from arch_harness import ATOL, hf_logits

    hf = build_hf_model("lfm2_moe", LFM2_MOE)
    with torch.no_grad():
        for name, b in hf.named_buffers():
            if name.endswith("expert_bias"):
                b.normal_(0.0, 0.5)
    with tempfile.TemporaryDirectory() as d:
        save_hf_model(hf, d, "transformers5")
        model = load_model(d)[0]
    prompts = make_prompts((9, 3), seed=12)
    tokens, padding = left_pad(prompts)
    logits = model(tokens, offset=mx.array([-p for p in padding]))
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(np.array(logits[i, padding[i]:]), hf_logits(hf, p),
                                   atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("text_type, vlm_type, config", [
    ("qwen3_5_text", "qwen3_5", QWEN3_5), ("qwen3_5_moe_text", "qwen3_5_moe", QWEN3_5_MOE)])
def test_qwen3_5_multimodal_checkpoint_layout(text_type, vlm_type, config, tmp_path):
    # The hub's Qwen3.5 checkpoints are multimodal: text settings under text_config,
    # the language model under model.language_model., a vision tower to ignore.
    import json

    hf = build_hf_model(text_type, config)
    save_hf_model(hf, tmp_path / "text", "transformers5")
    text_model = load_model(tmp_path / "text")[0]
    text_config = json.loads((tmp_path / "text" / "config.json").read_text())
    weights = mx.load(str(tmp_path / "text" / "model.safetensors"))
    vlm = {k.replace("model.", "model.language_model.", 1): v for k, v in weights.items()}
    vlm["model.visual.patch_embed.proj.weight"] = mx.zeros((4, 4))
    (tmp_path / "vlm").mkdir()
    mx.save_safetensors(str(tmp_path / "vlm" / "model.safetensors"), vlm)
    (tmp_path / "vlm" / "config.json").write_text(json.dumps(
        {"model_type": vlm_type, "text_config": text_config,
         "vision_config": {"depth": 1}, "tie_word_embeddings": False}))
    vlm_model = load_model(tmp_path / "vlm")[0]
    tokens = mx.array(make_prompts((9,), seed=13))
    assert mx.allclose(vlm_model(tokens), text_model(tokens), atol=1e-6).item()


def test_kimi_linear_reads_hub_layer_lists():
    from mlx_lm_batched.models.kimi_linear import ModelArgs
    hub = ModelArgs.from_dict(dict(
        model_type="kimi_linear", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4,
        intermediate_size=96, num_attention_heads=4, first_k_dense_replace=2,
        linear_attn_config={"full_attn_layers": [2, 4], "kda_layers": [1, 3], "head_dim": 16,
                            "num_heads": 4, "short_conv_kernel_size": 3}))
    assert hub.layer_types == ["linear_attention", "full_attention"] * 2
    assert hub.mlp_layer_types == ["dense", "dense", "sparse", "sparse"]
    assert (hub.linear_head_dim, hub.linear_num_heads, hub.linear_conv_kernel_dim) == (16, 4, 3)
