"""Each family's config defaults against transformers' config class: our
``ModelArgs`` built from ``ConfigClass().to_dict()`` derive the same head sizes,
key/value heads, RoPE base, per-layer windows and per-layer attention chunks
(Llama 4's ``chunked_attention`` layers) as transformers does.

The models are built lazily (MLX allocates nothing until evaluated), so the
full-size default configs cost only Python time."""

import math

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from mlx_lm_batched.models import MODEL_TYPES, get_model_module
from mlx_lm_batched.models.cache import make_prompt_cache
from mlx_lm_batched.layers.attention import Attention

TYPES = sorted(t for t in MODEL_TYPES if t in CONFIG_MAPPING_NAMES)
# State-space stacks without attention heads: checked by their state, conv and head
# sizes instead (``test_state_space_defaults_match_transformers``).
SSM_TYPES = ("falcon_mamba", "mamba", "mamba2")
# transformers' config class of these names is a vision encoder alone (the checkpoints
# of the name nest a text model): checked by ``test_vision_only_configs_are_refused``.
VISION_ONLY_TYPES = ("pixtral",)


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


@pytest.mark.parametrize("model_type", VISION_ONLY_TYPES)
def test_vision_only_configs_are_refused(model_type):
    module = get_model_module(model_type)
    with pytest.raises(ValueError, match=f"{model_type}: the config has no text_config"):
        module.ModelArgs.from_dict(AutoConfig.for_model(model_type).to_dict())


@pytest.mark.parametrize("model_type",
                         [t for t in TYPES if t not in SSM_TYPES + VISION_ONLY_TYPES])
def test_defaults_match_transformers_config(model_type):
    config = AutoConfig.for_model(model_type)
    assert hasattr(config.get_text_config(), "num_attention_heads"), \
        f"{model_type}: no attention heads; check it in SSM_TYPES' test instead"
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


def test_every_state_space_type_is_registered():
    # The attention test above covers every other type; none may fall between the two.
    assert set(SSM_TYPES) <= set(TYPES)
    no_heads = [t for t in TYPES if t not in SSM_TYPES
                and not hasattr(AutoConfig.for_model(t).get_text_config(), "num_attention_heads")]
    assert no_heads == []


def lazy_weights(hf_model):
    """The transformers model's state dict as unevaluated MLX zeros (shapes only)."""
    return {k: mx.zeros(tuple(v.shape)) for k, v in hf_model.state_dict().items()}


@pytest.mark.parametrize("model_type", SSM_TYPES)
def test_state_space_defaults_match_transformers(model_type):
    import torch
    from transformers import AutoModelForCausalLM

    config = AutoConfig.for_model(model_type)
    module = get_model_module(model_type)
    # Only what a config must name; every other field takes our default, which must
    # be transformers' default (absent from an older checkpoint's config.json).
    required = {k: getattr(config, k)
                for k in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")}
    args = module.ModelArgs.from_dict(required)
    D = config.expand * config.hidden_size
    assert args.intermediate_size == getattr(config, "intermediate_size", D) == D
    for name in ("state_size", "conv_kernel", "expand", "use_bias", "use_conv_bias",
                 "layer_norm_epsilon", "tie_word_embeddings", "num_heads", "head_dim",
                 "n_groups", "mixer_rms_eps"):
        if hasattr(config, name):
            assert getattr(args, name) == getattr(config, name), (model_type, name)
    if model_type != "mamba2":  # Mamba-2 has no dt projection (per-head dt)
        assert args.time_step_rank == config.time_step_rank == math.ceil(config.hidden_size / 16)

    # The parameters our model builds from those defaults: the same names and shapes
    # as transformers' model (built on the meta device, nothing allocated), after our
    # sanitize; ours are lazy too (MLX allocates nothing unevaluated).
    model = module.Model(args)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
    theirs = {k: v.shape for k, v in model.sanitize(lazy_weights(hf)).items()}
    ours = {k: v.shape for k, v in tree_flatten(model.parameters())}
    assert ours == theirs
    mixer = model.layers[0].mixer
    if model_type == "mamba2":
        low, high = config.time_step_limit
        assert mixer._dt_limit == (low, high)

    # Per-row state after one token (built lazily): the conv state keeps the last
    # kernel - 1 inputs of every conv channel, the SSM state is (channels or heads x
    # head_dim) x state_size, as transformers' cache.
    cache = make_prompt_cache(model)
    model(mx.zeros((1, 1), dtype=mx.int32), cache=cache)
    conv, ssm = cache[0].state
    K, N = config.conv_kernel, config.state_size
    if model_type == "mamba2":
        conv_dim = D + 2 * config.n_groups * N
        assert ssm.shape == (1, config.num_heads, config.head_dim, N)
    else:
        conv_dim = D
        assert ssm.shape == (1, D, N)
    assert conv.shape == (1, K - 1, conv_dim)
    assert len(cache) == config.num_hidden_layers


def test_kimi_linear_defaults_match_transformers():
    # Fields a checkpoint may leave out take transformers' defaults (the MoE routing,
    # latent attention and delta-attention sizes; the layer patterns they derive).
    config = AutoConfig.for_model("kimi_linear")
    required = {k: getattr(config, k) for k in ("model_type", "hidden_size", "num_hidden_layers",
                                                "vocab_size", "intermediate_size",
                                                "num_attention_heads")}
    args = get_model_module("kimi_linear").ModelArgs.from_dict(required)
    for name in ("num_key_value_heads", "moe_intermediate_size", "num_experts",
                 "num_experts_per_token", "num_shared_experts", "moe_renormalize",
                 "num_expert_group", "topk_group", "routed_scaling_factor", "kv_lora_rank",
                 "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                 "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim", "rms_norm_eps",
                 "hidden_act", "tie_word_embeddings", "layer_types", "mlp_layer_types"):
        assert getattr(args, name) == getattr(config, name), name
