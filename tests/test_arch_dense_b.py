"""Dense families, group B, and the length-dependent RoPE variants, against
transformers on tiny random configs in both config layouts.

RoPE variants whose frequencies depend on the sequence length (``dynamic``,
``longrope``) use a small pretraining length so short prompts and generations
cross it; besides the harness checks they are compared step by step with
transformers decoding each prompt alone (``check_decode_matches_transformers``),
which is where the per-row length rule shows.
"""

import tempfile

import mlx_lm_batched  # noqa: F401
import mlx.core as mx
import numpy as np
import pytest
import torch

from arch_harness import (VOCAB, ATOL, build_hf_model, make_prompts, run_family,
                          reset_hf_rope, save_hf_model)
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.utils import load_model

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)  # ids inside the tiny vocabulary
# Weights at std 0.3 (harness default 0.1) sharpen attention enough that position
# details (partial/interleaved rotary, RoPE scaling, learned positions) move the
# logits far beyond the tolerance: at 0.1 a wrong dynamic-NTK base moved them 3e-5.
STD = 0.3
GPT = dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=64,
           bos_token_id=1, eos_token_id=2)
NEOX = {k: v for k, v in BASE.items() if k != "num_key_value_heads"}
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}

# Pretraining length 24: the first generation row (5 + 16 tokens) stays below it so
# the harness's incremental-vs-full check is meaningful (length-dependent RoPE makes
# a chunked prefill differ from one forward once a sequence crosses it, in
# transformers too); the other rows and the 30-token prompt cross it.
CROSSING = {"lengths": (7, 30, 3, 12), "gen_lengths": (5, 14, 20)}
SHORT, LONG = [1.0 + 0.1 * i for i in range(8)], [1.5 + 0.5 * i for i in range(8)]

# name -> (config kwargs, options: model_type, harness options, decode lengths)
FAMILIES = {
    "llama-dynamic-rope": (
        dict(BASE, max_position_embeddings=24,
             rope_scaling={"rope_type": "dynamic", "factor": 3.0}),
        dict(CROSSING, model_type="llama", decode=(5, 22, 30)),
    ),
    "llama-yarn-rope": (
        dict(BASE, max_position_embeddings=128,
             rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 8.0,
                           "beta_slow": 1.0, "original_max_position_embeddings": 32}),
        dict(model_type="llama", decode=(5, 22)),
    ),
    # yarn's other knobs: fractional correction range, mscale / mscale_all_dim.
    "qwen2-yarn-rope": (
        dict(BASE, max_position_embeddings=128,
             rope_scaling={"rope_type": "yarn", "factor": 4.0, "truncate": False,
                           "mscale": 1.0, "mscale_all_dim": 0.5,
                           "original_max_position_embeddings": 32}),
        dict(model_type="qwen2"),
    ),
    "phi": (dict(BASE, num_key_value_heads=4, partial_rotary_factor=0.5), {}),
    # qk LayerNorm, and yarn on a partial rotary: the attention factor scales only
    # the rotated features.
    "phi-qk-norm-yarn": (
        dict(BASE, num_key_value_heads=4, partial_rotary_factor=0.75, qk_layernorm=True,
             max_position_embeddings=128,
             rope_scaling={"rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 32}),
        dict(model_type="phi"),
    ),
    # Phi-4-mini style partial rotary; a window on every layer.
    "phi3": (dict(BASE, partial_rotary_factor=0.75, sliding_window=8), WINDOWED),
    # LongRoPE: short factors up to 24 tokens, long ones beyond (attention factor
    # from max_position_embeddings / original_max_position_embeddings = 4).
    "phi3-longrope": (
        dict(BASE, max_position_embeddings=96, original_max_position_embeddings=24,
             rope_scaling={"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG}),
        dict(CROSSING, model_type="phi3", decode=(5, 22, 30)),
    ),
    "gpt2": (dict(GPT, scale_attn_by_inverse_layer_idx=True), {}),
    "gpt_neox": (dict(NEOX, rotary_pct=0.5), {}),
    "gpt_neox-sequential": (dict(NEOX, use_parallel_residual=False, attention_bias=False),
                            dict(model_type="gpt_neox")),
    "gpt_bigcode": (GPT, {}),
    "gpt_bigcode-multi-head": (dict(GPT, multi_query=False), dict(model_type="gpt_bigcode")),
    "stablelm": (dict(BASE, partial_rotary_factor=0.25, use_qkv_bias=True), {}),
    "stablelm-parallel-qk-norm": (
        dict(BASE, partial_rotary_factor=0.5, qk_layernorm=True, use_parallel_residual=True),
        dict(model_type="stablelm"),
    ),
    "cohere": (dict(BASE, logit_scale=0.5, use_qk_norm=True), {}),
    "cohere2": (dict(BASE, num_hidden_layers=3, logit_scale=0.5, sliding_window=8,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
                WINDOWED),
    "glm": (dict(BASE, head_dim=16, partial_rotary_factor=0.5), {}),
    "nemotron": (dict(BASE, partial_rotary_factor=0.5, attention_bias=True, mlp_bias=True), {}),
    # Dynamic NTK on interleaved (Cohere) and partial (GPT-NeoX) rotary.
    "cohere-dynamic-rope": (
        dict(BASE, logit_scale=0.5, max_position_embeddings=24,
             rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
        dict(CROSSING, model_type="cohere", decode=(5, 30)),
    ),
    "gpt_neox-dynamic-rope": (
        dict(NEOX, rotary_pct=0.5, max_position_embeddings=24,
             rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
        dict(CROSSING, model_type="gpt_neox", decode=(5, 30)),
    ),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout, ignore=("decode",))


def hf_decode_logprobs(hf, prompt, continuation):
    """Log-probs after the prompt and after each continuation token, from transformers
    decoding one sequence the way ``BatchEngine`` feeds it (prompt[:-1], the last
    prompt token, then one token per step)."""
    reset_hf_rope(hf)
    out, past, steps = [], None, []
    if len(prompt) > 1:
        steps.append(prompt[:-1])
    steps += [[prompt[-1]]] + [[t] for t in continuation]
    with torch.no_grad():
        for i, chunk in enumerate(steps):
            res = hf(torch.tensor([chunk]), cache=past, use_cache=True)
            past = res.cache
            if i >= len(steps) - len(continuation) - 1:
                out.append(torch.log_softmax(res.logits[0, -1].float(), -1).numpy())
    return np.stack(out)


def check_decode_matches_transformers(model_type, config, lengths, layout, steps=12):
    """A padded batch, teacher-forced through prefill and ``steps`` decode steps,
    gives each row the log-probs transformers gives that prompt alone."""
    hf = build_hf_model(model_type, config, std=STD)
    with tempfile.TemporaryDirectory() as d:
        save_hf_model(hf, d, layout)
        model, _ = load_model(d)
    prompts = make_prompts(lengths, seed=3)
    conts = make_prompts([steps] * len(prompts), seed=4)
    tokens, padding = left_pad(prompts)
    engine = BatchEngine(model)
    _, lp = engine.prefill(tokens, padding)
    ours = [np.array(lp)]
    for j in range(steps):
        _, lp = engine.step(mx.array([c[j] for c in conts]))
        ours.append(np.array(lp))
    ours = np.stack(ours, 1)
    for i, (p, c) in enumerate(zip(prompts, conts)):
        np.testing.assert_allclose(ours[i], hf_decode_logprobs(hf, p, c), atol=ATOL, rtol=ATOL,
                                   err_msg=f"{model_type} row {i} decode vs transformers")


DECODE = sorted(n for n, (_, o) in FAMILIES.items() if "decode" in o)


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", DECODE)
def test_decode_matches_transformers_per_row(name, layout):
    config, options = FAMILIES[name]
    check_decode_matches_transformers(options.get("model_type", name), config,
                                      options["decode"], layout)
