"""MiniCPM3 (latent attention with MiniCPM's scalings) and MiniMax (softmax attention
mixed with lightning attention, MoE) against transformers on tiny random configs, and
for MiniMax the state checks of test_arch_recurrent.py: each padded row's lightning
state equals the row alone, chunked prefill equals one pass, a padded second turn and
saved/loaded caches continue exactly."""

import mlx.core as mx
import numpy as np
import pytest

from arch_harness import BASE_SMALL, VOCAB, make_prompts, run_family
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.models.cache import load_prompt_cache, save_prompt_cache
from test_arch_deepseek import sharpen
from test_arch_recurrent import _prefill, _states

MINICPM3 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
                scale_emb=2.5, scale_depth=1.4, dim_model_base=16)

MINIMAX = dict(BASE_SMALL, num_hidden_layers=4, intermediate_size=32, num_local_experts=4,
               num_experts_per_tok=2, block_size=4,
               layer_types=["linear_attention", "full_attention", "full_attention",
                            "linear_attention"],
               full_attn_alpha_factor=0.9, full_attn_beta_factor=1.2,
               linear_attn_alpha_factor=1.3, linear_attn_beta_factor=0.8,
               mlp_alpha_factor=0.7, mlp_beta_factor=1.4)

FAMILIES = {
    # Sharpened attention: DeepSeek's interleaved rotation would miss the tolerance.
    "minicpm3": (dict(MINICPM3, tie_word_embeddings=False, v_head_dim=12), {"hf_hook": sharpen}),
    # Full-rank queries, tied head, transformers' no-op defaults for the scalings.
    "minicpm3-tied-no-q-lora": (dict(MINICPM3, q_lora_rank=None, scale_depth=None,
                                     dim_model_base=None, rope_parameters={
                                         "rope_type": "linear", "factor": 2.0,
                                         "rope_theta": 5000.0}),
                                {"model_type": "minicpm3", "hf_hook": sharpen}),
    # Lightning layers first and last; blocks of 4 columns (several per prefill in
    # transformers and here); every residual factor away from 1.
    "minimax": (MINIMAX, {}),
    # transformers' default layer pattern (softmax on even layers), tied head, a factor
    # written as a JSON integer.
    "minimax-default-layers": (dict(MINIMAX, layer_types=None, num_hidden_layers=3,
                                    tie_word_embeddings=True, mlp_beta_factor=2),
                               {"model_type": "minimax"}),
    # Softmax attention only (no state layer), with a sliding window.
    "minimax-softmax-only": (dict(MINIMAX, num_hidden_layers=2, sliding_window=8,
                                  layer_types=["full_attention"] * 2),
                             {"model_type": "minimax", "lengths": (11, 3, 20, 9),
                              "gen_lengths": (5, 14, 1)}),
    # mlx-lm's own ``minimax`` (MiniMax-M2, softmax only: rotary_dim, no layer_types)
    # loads as our minimax_m2; mlx-lm is the oracle on its own weights and names.
    "minimax-mlx-lm-layout": (dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=256, num_hidden_layers=2,
                                   num_local_experts=4, num_experts_per_tok=2,
                                   shared_intermediate_size=0, rms_norm_eps=1e-6,
                                   rope_theta=10000.0, rotary_dim=8),
                              {"model_type": "minimax", "oracle": "mlx_lm"}),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


@pytest.fixture(scope="module")
def minimax():
    import tempfile

    from arch_harness import build_hf_model, save_hf_model
    from mlx_lm_batched.utils import load_model

    with tempfile.TemporaryDirectory() as d:
        save_hf_model(build_hf_model("minimax", MINIMAX), d, "transformers5")
        return load_model(d)[0]


def _assert_rows_equal_solo(engine, logprobs, solos, rows):
    """Each row's lightning state and last logprobs equal those of its solo engine."""
    states = _states(engine)
    assert states, "no StateCache in a MiniMax cache with lightning layers"
    for i, (solo, solo_lp) in zip(rows, solos):
        for layer, (ours, theirs) in enumerate(zip(states, _states(solo))):
            for a, b in zip(ours, theirs):
                # The batch is prefilled in chunks of 8, each solo row in one chunk:
                # different BLAS/kernel calls and key lengths (README, "How batching
                # stays exact"). Measured: up to 7e-5 on states up to 38 in magnitude
                # (4e-5 with MLX's ops instead of our CPU primitives).
                np.testing.assert_allclose(a[i], b[0], atol=2e-4, rtol=1e-4,
                                           err_msg=f"row {i} layer {layer}")
        np.testing.assert_allclose(np.array(logprobs[i]), np.array(solo_lp[0]), atol=1e-4)


def test_minimax_padded_rows_state_equals_row_alone(minimax):
    # Mostly-padding short rows; chunks of 8 columns over blocks of 4.
    prompts = make_prompts((41, 2, 17, 1), seed=5)
    engine, _, logprobs = _prefill(minimax, prompts, prefill_step_size=8)
    solos = [_prefill(minimax, [p])[::2] for p in prompts]
    _assert_rows_equal_solo(engine, logprobs, solos, range(len(prompts)))


def test_minimax_chunked_prefill_equals_one_pass(minimax):
    prompts = make_prompts((30, 9), seed=6)
    one, _, lp_one = _prefill(minimax, prompts, prefill_step_size=512)
    chunked, _, lp_chunked = _prefill(minimax, prompts, prefill_step_size=3)
    # Chunks of 3 and one pass sum the recurrence in other orders: float bounds, not bits
    # (measured: 1.6e-5 on one state value of 0.46 on an AVX2-only AMD EPYC, 2026-12-04,
    # where the small-matmul kernel serves the chunks and the BLAS the one pass).
    for a_layer, b_layer in zip(_states(one), _states(chunked)):
        for a, b in zip(a_layer, b_layer):
            np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.array(lp_one), np.array(lp_chunked), atol=1e-4)


def test_minimax_second_turn_with_padding_equals_row_alone(minimax):
    # A later turn whose rows add different numbers of tokens: its padding columns
    # follow cached tokens and must leave the lightning state untouched.
    first, second = make_prompts((9, 3), seed=9), make_prompts((2, 7), seed=10)
    engine, _, _ = _prefill(minimax, first)
    tokens, padding = left_pad(second)
    _, logprobs = engine.prefill(tokens, padding)
    solos = []
    for i in range(2):
        solo, _, _ = _prefill(minimax, [first[i]])
        _, solo_lp = solo.prefill(mx.array([second[i]]))
        solos.append((solo, solo_lp))
    _assert_rows_equal_solo(engine, logprobs, solos, range(2))


def test_minimax_save_load_continues_exactly(minimax, tmp_path):
    prompts = make_prompts((13, 4, 8), seed=8)
    engine, y, _ = _prefill(minimax, prompts)
    path = str(tmp_path / "state.safetensors")
    save_prompt_cache(path, engine.cache)
    again = BatchEngine(minimax, prompt_cache=load_prompt_cache(path))
    y1, y2 = y, y
    for _ in range(4):
        (y1, lp1), (y2, lp2) = engine.step(y1), again.step(y2)
        np.testing.assert_array_equal(np.array(y1), np.array(y2))
        np.testing.assert_allclose(np.array(lp1), np.array(lp2), atol=1e-5)


def test_minimax_config_errors_name_layer_types():
    from mlx_lm_batched.models.minimax import ModelArgs

    base = dict(model_type="minimax", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                intermediate_size=32, num_attention_heads=4)
    with pytest.raises(ValueError, match="layer_types must list 2 entries"):
        ModelArgs.from_dict(dict(base, layer_types=["full_attention", "mamba"]))
    with pytest.raises(ValueError, match="layer_types must list 2 entries"):
        ModelArgs.from_dict(dict(base, layer_types=["full_attention"]))
