"""Each family's config defaults against transformers' config class: our
``ModelArgs`` built from ``ConfigClass().to_dict()`` derive the same head sizes,
key/value heads, RoPE base and per-layer windows as transformers does.

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
from mlx_lm_batched.models.layers import Attention

TYPES = sorted(t for t in MODEL_TYPES if t in CONFIG_MAPPING_NAMES)
# State-space stacks without attention heads: checked by their state, conv and head
# sizes instead (``test_state_space_defaults_match_transformers``).
SSM_TYPES = ("falcon_mamba", "mamba", "mamba2")


def hf_expectations(config):
    """(head_dim, kv heads, rope theta, windows) the way transformers derives them."""
    text = config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    n_kv = getattr(text, "num_key_value_heads", None) or heads
    params = getattr(text, "rope_parameters", None) or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        params = params.get("full_attention") or next(iter(params.values()))
    theta = params.get("rope_theta", getattr(text, "rope_theta", None))
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None)
    if types is None:
        windows = [window] * text.num_hidden_layers
    else:
        windows = [window if t == "sliding_attention" else None for t in types]
    return head_dim, n_kv, theta, windows


@pytest.mark.parametrize("model_type", [t for t in TYPES if t not in SSM_TYPES])
def test_defaults_match_transformers_config(model_type):
    config = AutoConfig.for_model(model_type)
    assert hasattr(config.get_text_config(), "num_attention_heads"), \
        f"{model_type}: no attention heads; check it in SSM_TYPES' test instead"
    module = get_model_module(model_type)
    model = module.Model(module.ModelArgs.from_dict(config.to_dict()))
    head_dim, n_kv, theta, windows = hf_expectations(config)
    # The first shared attention layer (hybrids start with recurrent blocks; latent
    # attention (DeepSeek) has other sizes and is not an ``Attention``).
    attn = next((m for _, m in model.named_modules() if isinstance(m, Attention)), None)
    if attn is not None:
        assert (attn.head_dim, attn.n_kv_heads) == (head_dim, n_kv), model_type
    if theta is not None and hasattr(model.args, "rope_theta"):
        assert model.args.rope_theta == pytest.approx(theta), model_type
    if "layer_windows" in dir(model):  # windowed attention stacks (not recurrent hybrids)
        assert model.layer_windows == windows, model_type


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
