"""Parity harness for architectures: tiny random Hugging Face models as the oracle.

``check_architecture(model_type, config_kwargs, layout)`` builds the transformers
model from a tiny config with random weights, saves it with ``save_pretrained``
(optionally rewriting config.json to the transformers-4 layout), loads it with our
``load_model`` and checks:

1. logits of a left-padded batch equal transformers run on each prompt alone;
2. greedy generation of each padded row equals that prompt generated alone;
3. incremental decoding with the cache equals one full forward pass.
"""

import json
import tempfile
from pathlib import Path

import mlx_lm_batched  # noqa: F401
import mlx.core as mx
import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from mlx_lm_batched.batching import BatchEngine, left_pad
from mlx_lm_batched.utils import load_model

ATOL = 1e-4
VOCAB = 128
# A tiny llama-shaped config most families start from.
BASE_SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def to_transformers4_layout(config):
    """Move ``rope_parameters`` to the top-level keys transformers 4 wrote."""
    config = dict(config)
    params = config.pop("rope_parameters", None)
    if not isinstance(params, dict):
        return config
    if params and all(isinstance(v, dict) for v in params.values()):
        full = params.get("full_attention") or next(iter(params.values()))
        local = params.get("sliding_attention")
        if local is not None:
            config["rope_local_base_freq"] = local.get("rope_theta")
        params = full
    config["rope_theta"] = params.get("rope_theta", 10000.0)
    if params.get("rope_type", "default") != "default":
        config["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    for key in ("partial_rotary_factor",):
        if key in params:
            config[key] = params[key]
    if config.get("model_type") == "gpt_neox":  # GPT-NeoX's own names (Pythia configs)
        config["rotary_emb_base"] = config.pop("rope_theta")
        config["rotary_pct"] = config.pop("partial_rotary_factor", 0.25)
    return config


def build_hf_model(model_type, config_kwargs, seed=0, std=0.3):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **config_kwargs)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, std)
        for name, b in model.named_buffers():  # saved router biases (zeros by default)
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, std)
    return model


def save_hf_model(model, directory, layout):
    model.save_pretrained(directory)
    path = Path(directory) / "config.json"
    config = json.loads(path.read_text())
    if layout == "transformers4":
        config = to_transformers4_layout(config)
    elif layout != "transformers5":
        raise ValueError(f"unknown layout {layout}")
    path.write_text(json.dumps(config, indent=2))


def reset_hf_rope(model):
    """Forget transformers' dynamic-RoPE state: its ``dynamic`` type keeps the largest
    length seen across calls, so a shorter sequence after a longer one would reuse
    the longer one's frequencies instead of being seen fresh."""
    for m in model.modules():
        if hasattr(m, "original_inv_freq") and hasattr(m, "original_max_seq_len"):
            m.inv_freq.copy_(m.original_inv_freq)
            m.max_seq_len_cached = m.original_max_seq_len


def hf_logits(model, prompt):
    reset_hf_rope(model)
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float().numpy()


def make_prompts(lengths, seed=1):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, VOCAB, n)] for n in lengths]


def greedy_tokens(model, prompts, n_tokens, **engine_kwargs):
    tokens, padding = left_pad(prompts)
    engine = BatchEngine(model, **engine_kwargs)
    y, _ = engine.prefill(tokens, padding)
    out = [y]
    for _ in range(n_tokens - 1):
        y, _ = engine.step(y)
        out.append(y)
    return np.array(mx.stack(out, axis=1))


def check_architecture(model_type, config_kwargs, layout="transformers5", lengths=(7, 1, 12, 4),
                       gen_lengths=None, new_tokens=16, max_kv_size=None, std=0.3):
    """Run the three parity checks; returns the loaded MLX model for extra checks.

    ``std``: weight scale; larger values sharpen attention so that position
    details (RoPE variants) move the logits well past the tolerance."""
    hf = build_hf_model(model_type, config_kwargs, std=std)
    with tempfile.TemporaryDirectory() as d:
        save_hf_model(hf, d, layout)
        model, _ = load_model(d)

    # 1. Padded-batch logits equal transformers on each prompt alone.
    prompts = make_prompts(lengths)
    tokens, padding = left_pad(prompts)
    logits = model(tokens, offset=mx.array([-p for p in padding]))
    for i, p in enumerate(prompts):
        ours = np.array(logits[i, padding[i]:])
        np.testing.assert_allclose(ours, hf_logits(hf, p), atol=ATOL, rtol=ATOL,
                                   err_msg=f"{model_type} row {i} vs transformers")

    # 2. Greedy generation: each padded row equals the prompt alone.
    gen_prompts = make_prompts(gen_lengths or lengths, seed=2)
    batch = greedy_tokens(model, gen_prompts, new_tokens, max_kv_size=max_kv_size)
    for i, p in enumerate(gen_prompts):
        solo = greedy_tokens(model, [p], new_tokens, max_kv_size=max_kv_size)
        np.testing.assert_array_equal(batch[i], solo[0], err_msg=f"{model_type} row {i}")

    # 3. Incremental decoding (chunked prefill + steps) equals one full forward.
    p = gen_prompts[0] + [int(t) for t in batch[0]]
    full = np.array(model(mx.array([p]))[0, -1])
    engine = BatchEngine(model, prefill_step_size=3)
    _, logprobs = engine.prefill(mx.array([p[:-1]]))
    last = np.array(model(mx.array([[p[-1]]]), offset=mx.array([len(p) - 1]),
                          cache=engine.cache)[0, -1])
    np.testing.assert_allclose(last, full, atol=ATOL, rtol=ATOL,
                               err_msg=f"{model_type} incremental vs full")
    return model
