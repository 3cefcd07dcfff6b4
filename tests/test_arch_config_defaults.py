"""Each family's config defaults against transformers' config class: our
``ModelArgs`` built from ``ConfigClass().to_dict()`` derive the same head sizes,
key/value heads, RoPE base, per-layer windows and per-layer attention chunks
(Llama 4's ``chunked_attention`` layers) as transformers does.

The models are built lazily (MLX allocates nothing until evaluated), so the
full-size default configs cost only Python time."""

import pytest
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from mlx_lm_batched.models import MODEL_TYPES, get_model_module
from mlx_lm_batched.models.layers import Attention

TYPES = sorted(t for t in MODEL_TYPES if t in CONFIG_MAPPING_NAMES)


def hf_expectations(config):
    """(head_dim, kv heads, rope theta, windows, chunks) the way transformers derives
    them."""
    text = config.get_text_config()
    # Heterogeneous configs (per-layer head sizes, Gemma 4) answer per layer only.
    first = text.per_layer_config[0] if getattr(text, "is_heterogeneous", False) else text
    heads = text.num_attention_heads
    head_dim = getattr(first, "head_dim", None) or text.hidden_size // heads
    n_kv = getattr(first, "num_key_value_heads", None) or heads
    params = getattr(text, "rope_parameters", None) or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        params = params.get("full_attention") or next(iter(params.values()))
    theta = params.get("rope_theta", getattr(text, "rope_theta", None))
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None)
    chunk = getattr(text, "attention_chunk_size", None)
    if types is None:
        windows = [window] * text.num_hidden_layers
        chunks = [None] * text.num_hidden_layers
    else:
        windows = [window if t == "sliding_attention" else None for t in types]
        chunks = [chunk if t == "chunked_attention" else None for t in types]
    return head_dim, n_kv, theta, windows, chunks


@pytest.mark.parametrize("model_type", TYPES)
def test_defaults_match_transformers_config(model_type):
    config = AutoConfig.for_model(model_type)
    if not hasattr(config.get_text_config(), "num_attention_heads"):
        pytest.skip(f"{model_type}: no num_attention_heads in transformers' config")
    module = get_model_module(model_type)
    model = module.Model(module.ModelArgs.from_dict(config.to_dict()))
    head_dim, n_kv, theta, windows, chunks = hf_expectations(config)
    # The first shared attention layer (hybrids start with recurrent blocks; latent
    # attention (DeepSeek) has other sizes and is not an ``Attention``).
    # In layer order: named_modules() is not, and Gemma 4's layers differ in size.
    attns = [getattr(layer, "self_attn", None) for layer in getattr(model, "layers", [])]
    attn = next((m for m in attns if isinstance(m, Attention)), None) or next(
        (m for _, m in model.named_modules() if isinstance(m, Attention)), None)
    if attn is not None:
        assert (attn.head_dim, attn.n_kv_heads) == (head_dim, n_kv), model_type
    if theta is not None and hasattr(model.args, "rope_theta"):
        assert model.args.rope_theta == pytest.approx(theta), model_type
    if "layer_windows" in dir(model):  # windowed attention stacks (not recurrent hybrids)
        assert model.layer_windows == windows, model_type
        assert (model.get("layer_chunks") or [None] * len(windows)) == chunks, model_type


# Family-specific fields our ModelArgs derive from a config the way transformers'
# config class does (absent sizes, no-op scalings, default layer patterns).
FAMILY_FIELDS = {
    "minicpm3": (("v_head_dim", "scale_emb", "scale_depth", "dim_model_base", "q_lora_rank",
                  "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                  "tie_word_embeddings"),
                 [{}, {"scale_depth": None, "dim_model_base": None, "v_head_dim": None,
                       "num_hidden_layers": 9}]),
    "minimax": (("layer_types", "num_key_value_heads", "block_size", "full_attn_alpha_factor",
                 "full_attn_beta_factor", "linear_attn_alpha_factor", "linear_attn_beta_factor",
                 "mlp_alpha_factor", "mlp_beta_factor", "num_local_experts",
                 "num_experts_per_tok", "sliding_window", "tie_word_embeddings"),
                [{}, {"num_hidden_layers": 5}]),
}


@pytest.mark.parametrize("model_type", sorted(FAMILY_FIELDS))
def test_family_fields_match_transformers_config(model_type):
    fields, overrides = FAMILY_FIELDS[model_type]
    module = get_model_module(model_type)
    for kwargs in overrides:
        config = AutoConfig.for_model(model_type, **kwargs)
        # The checked fields as the user wrote them (absent, or None): our defaults
        # and derivations must give what transformers' __post_init__ gives.
        saved = {k: v for k, v in config.to_dict().items() if k not in fields}
        args = module.ModelArgs.from_dict(dict(saved, **kwargs))
        for field in fields:
            assert getattr(args, field) == getattr(config, field), (model_type, kwargs, field)


HETEROGENEOUS = [t for t in TYPES if getattr(AutoConfig.for_model(t).get_text_config(),
                                             "is_heterogeneous", False)]


@pytest.mark.parametrize("model_type", HETEROGENEOUS)
def test_per_layer_attention_sizes_match_transformers(model_type):
    """Configs with per-layer overrides (Gemma 4's global layers): every layer's head
    size and key/value heads, from transformers' own ``to_dict`` (``per_layer_config``)."""
    config = AutoConfig.for_model(model_type)
    module = get_model_module(model_type)
    model = module.Model(module.ModelArgs.from_dict(config.to_dict()))
    text = config.get_text_config()
    expected = [(c.head_dim, c.num_key_value_heads) for c in text.per_layer_config]
    assert [(l.self_attn.head_dim, l.self_attn.n_kv_heads) for l in model.layers] == expected


@pytest.mark.parametrize("k_eq_v", [False, True])
def test_gemma4_hub_global_head_keys_match_transformers(k_eq_v):
    """Hub Gemma 4 configs name the global layers' sizes ``global_head_dim`` and
    ``num_global_key_value_heads`` (the latter only applies with ``attention_k_eq_v``);
    transformers turns them into ``per_layer_config``: both give the same layers."""
    from transformers import Gemma4TextConfig

    from mlx_lm_batched.models import gemma4_text

    hub = dict(model_type="gemma4_text", hidden_size=64, intermediate_size=64, vocab_size=32,
               num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               global_head_dim=48, num_global_key_value_heads=1, attention_k_eq_v=k_eq_v,
               hidden_size_per_layer_input=0)
    text = Gemma4TextConfig(**{k: v for k, v in hub.items() if k != "model_type"})
    expected = [(c.head_dim, c.num_key_value_heads) for c in text.per_layer_config]
    args = gemma4_text.ModelArgs.from_dict(hub)
    assert args.layer_dims() == expected
    assert args.layer_types == text.layer_types  # default pattern, last layer global
    model = gemma4_text.Model(args)
    assert [(l.self_attn.head_dim, l.self_attn.n_kv_heads) for l in model.layers] == expected
    saved = gemma4_text.ModelArgs.from_dict(dict(text.to_dict(), model_type="gemma4_text"))
    assert saved.layer_dims() == expected
