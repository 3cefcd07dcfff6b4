"""Parity harness for architectures: tiny random Hugging Face models as the oracle.

``check_architecture(model_type, config_kwargs, layout)`` builds the transformers
model from a tiny config with random weights, saves it with ``save_pretrained``
(optionally rewriting config.json to the transformers-4 layout), loads it with our
``load_model`` and checks:

1. logits of a left-padded batch equal transformers run on each prompt alone;
2. greedy generation of each padded row equals that prompt generated alone;
3. incremental decoding with the cache equals one full forward pass;
4. rows joining a running ``BatchGenerator`` generate what they generate alone.

Each ``tests/test_arch*.py`` module lists its families in a ``FAMILIES`` dict
(``name -> (config kwargs, options)``) and runs them with :func:`run_family`;
``test_arch_registry.py`` fails when a registered model_type has no entry.
"""

import importlib
import json
import tempfile
from pathlib import Path

import mlx_lm_batched  # noqa: F401
import mlx_lm_oracle
import mlx.core as mx
import numpy as np
import torch
from mlx.utils import tree_flatten
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.sched.generator import BatchGenerator
from mlx_lm_batched.utils import load_model

ATOL = 1e-4
VOCAB = 128
# A tiny llama-shaped config most families start from.
BASE_SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def to_transformers4_layout(config):
    """Move ``rope_parameters`` to the top-level keys transformers 4 wrote."""
    config = dict(config)
    if isinstance(config.get("text_config"), dict):  # multimodal: the text model's keys
        config["text_config"] = to_transformers4_layout(config["text_config"])
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
    # Multimodal checkpoints (text_config + vision_config) without a causal-LM class.
    auto = (AutoModelForCausalLM if type(config) in AutoModelForCausalLM._model_mapping
            else AutoModelForImageTextToText)
    model = auto.from_config(config, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, std)
        for name, b in model.named_buffers():  # saved router biases (zeros by default)
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, std)
    return model


def save_hf_model(model, directory, layout, saved_model_type=None):
    """``save_pretrained`` in ``layout``; ``saved_model_type`` renames the config's
    model_type (an alias registered for the same architecture)."""
    model.save_pretrained(directory)
    path = Path(directory) / "config.json"
    config = json.loads(path.read_text())
    if layout == "transformers4":
        config = to_transformers4_layout(config)
    elif layout != "transformers5":
        raise ValueError(f"unknown layout {layout}")
    if saved_model_type is not None:
        config["model_type"] = saved_model_type
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


def joined_tokens(model, prompts, n_tokens, max_kv_size=None):
    """Greedy tokens of each prompt run through a ``BatchGenerator`` where the first
    half of the rows start together and the others join after two decode steps."""
    # prefill_step_size above the prompt lengths: smaller steps hit a scheduler bug
    # (a chunk shorter than a row's padding raises in BatchEngine.prefill).
    gen = BatchGenerator(model, max_tokens=n_tokens, prefill_step_size=64,
                         max_kv_size=max_kv_size)
    half = max(1, len(prompts) // 2)
    uids = gen.insert(prompts[:half])
    out = {u: [] for u in uids}
    steps = 0
    while True:
        _, responses = gen.next()
        for r in responses:
            out[r.uid].append(r.token)
        if responses:
            steps += 1
        if steps == 2 and len(uids) < len(prompts):
            late = gen.insert(prompts[half:])
            uids += late
            out.update({u: [] for u in late})
        if len(uids) == len(prompts) and all(len(out[u]) == n_tokens for u in uids):
            return [out[u] for u in uids]
        if steps > 10 * n_tokens + 10:
            raise AssertionError("BatchGenerator did not finish its rows")


def check_architecture(model_type, config_kwargs, layout="transformers5", lengths=(7, 1, 12, 4),
                       gen_lengths=None, new_tokens=16, max_kv_size=None, std=0.3,
                       saved_model_type=None, hf_hook=None, oracle="transformers", rewrite=None):
    """Run the four parity checks; returns the loaded MLX model for extra checks.

    ``std``: weight scale; larger values sharpen attention so that position
    details (RoPE variants) move the logits well past the tolerance.
    ``saved_model_type``: load the checkpoint under this alias of ``model_type``.
    ``hf_hook``: called on the reference model (transformers', or mlx-lm's with
    ``oracle="mlx_lm"``) before saving (sharpen weights, keep router biases in range).
    ``rewrite``: called with the saved checkpoint's directory before loading it
    (another layout of the same model, e.g. a multimodal one transformers cannot build).
    ``oracle="mlx_lm"``: mlx-lm's module of ``model_type`` is the reference (families
    transformers has no model for; ``config_kwargs`` then in the flat layout)."""
    with tempfile.TemporaryDirectory() as d:
        if oracle == "mlx_lm":
            ref = mlx_lm_oracle.build_mlx_lm_model(model_type, config_kwargs, std=std)
            if hf_hook is not None:
                hf_hook(ref)
            mlx_lm_oracle.save_mlx_lm_model(
                ref, dict(config_kwargs, model_type=saved_model_type or model_type), d, layout)
            reference = lambda prompt: mlx_lm_oracle.mlx_lm_logits(ref, prompt)
        else:
            hf = build_hf_model(model_type, config_kwargs, std=std)
            if hf_hook is not None:
                hf_hook(hf)
            save_hf_model(hf, d, layout, saved_model_type)
            reference = lambda prompt: hf_logits(hf, prompt)
        if rewrite is not None:
            rewrite(d)
        model, _ = load_model(d)
    model_type = saved_model_type or model_type

    # 0. Sanitize leaves already-converted weights (our own names) as they are.
    params = dict(tree_flatten(model.parameters()))
    again = model.sanitize(dict(params))
    assert sorted(again) == sorted(params), f"{model_type}: sanitize renames converted weights"
    assert all(mx.array_equal(again[k], params[k]) for k in params)

    # 1. Padded-batch logits equal transformers on each prompt alone.
    prompts = make_prompts(lengths)
    tokens, padding = left_pad(prompts)
    logits = model(tokens, offset=mx.array([-p for p in padding]))
    for i, p in enumerate(prompts):
        ours = np.array(logits[i, padding[i]:])
        np.testing.assert_allclose(ours, reference(p), atol=ATOL, rtol=ATOL,
                                   err_msg=f"{model_type} row {i} vs {oracle}")

    # 2. Greedy generation: each padded row equals the prompt alone.
    gen_prompts = make_prompts(gen_lengths or lengths, seed=2)
    batch = greedy_tokens(model, gen_prompts, new_tokens, max_kv_size=max_kv_size)
    solos = []
    for i, p in enumerate(gen_prompts):
        solos.append(greedy_tokens(model, [p], new_tokens, max_kv_size=max_kv_size)[0])
        np.testing.assert_array_equal(batch[i], solos[i], err_msg=f"{model_type} row {i}")

    # 3. Incremental decoding (chunked prefill + steps) equals one full forward.
    p = gen_prompts[0] + [int(t) for t in batch[0]]
    full = np.array(model(mx.array([p]))[0, -1])
    engine = BatchEngine(model, prefill_step_size=3)
    _, logprobs = engine.prefill(mx.array([p[:-1]]))
    last = np.array(model(mx.array([[p[-1]]]), offset=mx.array([len(p) - 1]),
                          cache=engine.cache)[0, -1])
    np.testing.assert_allclose(last, full, atol=ATOL, rtol=ATOL,
                               err_msg=f"{model_type} incremental vs full")

    # 4. Rows joining a running BatchGenerator equal each prompt alone.
    joined = joined_tokens(model, gen_prompts, new_tokens, max_kv_size)
    for i, solo in enumerate(solos):
        np.testing.assert_array_equal(joined[i], solo, err_msg=f"{model_type} joined row {i}")
    return model


def run_family(name, entry, layout, ignore=()):
    """The parity test body of one ``FAMILIES`` entry ``(config kwargs, options)``;
    ``options["model_type"]`` names the architecture when ``name`` is a variant;
    ``ignore``: option keys the calling module uses for checks of its own."""
    config, options = entry
    options = {k: v for k, v in options.items() if k not in ignore}
    model_type = options.pop("model_type", name)
    return check_architecture(model_type, config, layout=layout, **options)


def layout_cases(families, one_layout=()):
    """``(name, layout)`` parameters: every family in both config layouts, the names in
    ``one_layout`` in the transformers 4 layout only (variants whose extra math does not
    depend on the layout: CI time)."""
    return [(name, layout) for name in sorted(families)
            for layout in ("transformers4", "transformers5")
            if name not in one_layout or layout == "transformers4"]


def family_model_type(name, entry):
    """The registered model_type an entry covers (its alias when it loads as one)."""
    options = entry[1]
    return options.get("saved_model_type") or options.get("model_type", name)


def collect_families(test_dir=Path(__file__).parent):
    """``{name: (module name, entry)}`` over the ``FAMILIES`` of every
    ``test_arch*.py`` module; a name listed twice is an error."""
    found = {}
    for path in sorted(test_dir.glob("test_arch*.py")):
        module = importlib.import_module(path.stem)
        for name, entry in getattr(module, "FAMILIES", {}).items():
            if name in found:
                raise ValueError(f"family '{name}' listed in {found[name][0]} and {path.stem}")
            found[name] = (path.stem, entry)
    return found
