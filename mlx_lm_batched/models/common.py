"""Constructor pieces shared by the llama-like architecture files: config-derived
attention sizes, the config's RoPE, and the ``CausalLM`` attributes every family
sets (decoder stack, untied head, per-layer windows)."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from ..layers.rope import make_rope
from ..layers.stack import DecoderStack
from .args import BaseModelArgs, normalize_rope_config


@dataclass(kw_only=True)
class StackArgs(BaseModelArgs):
    """Config fields (Hugging Face names) every family's decoder stack has, attention
    or not: state-space families (Mamba) inherit these, attention ones ``DecoderArgs``.
    (``vocab_size`` is declared by each subclass: families that give it a default
    redeclare it, and a field with a default cannot precede ``DecoderArgs``'s
    required ones.)"""

    model_type: str
    hidden_size: int
    num_hidden_layers: int


@dataclass(kw_only=True)
class DecoderArgs(StackArgs):
    """Config fields (Hugging Face names and defaults) that llama-like families share;
    a family's ``ModelArgs`` adds its own and redeclares a field to change its default."""

    intermediate_size: int  # a family that redeclares it ``= None`` gets 4 x hidden_size
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    rope_traditional: bool = False  # mlx-lm's field: interleaved rotary pairs
    rope_parameters: Optional[dict] = None  # transformers 5's RoPE layout

    def __post_init__(self):
        # Hugging Face's defaults for absent head counts, computed here once; a
        # subclass's own __post_init__ calls this first.
        self.num_key_value_heads, self.head_dim = attention_dims(self)
        if self.intermediate_size is None:  # a family's optional intermediate_size
            self.intermediate_size = 4 * self.hidden_size
        apply_rope_parameters(self)


def apply_rope_parameters(args):
    """Set the flat RoPE fields from ``args.rope_parameters`` when the constructor got
    it (``from_dict`` has already flattened it: the values agree)."""
    if not isinstance(args.rope_parameters, dict):
        return
    flat = normalize_rope_config({"rope_parameters": args.rope_parameters})
    for key, value in flat.items():
        if key == "rope_scaling" and args.rope_scaling is not None:
            continue
        if key != "rope_parameters" and hasattr(args, key):
            setattr(args, key, value)


def attention_dims(args):
    """``(n_kv_heads, head_dim)`` with Hugging Face's defaults for absent fields."""
    n_kv = args.num_key_value_heads or args.num_attention_heads
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    return n_kv, head_dim


def check_layer_types(args, kinds):
    """ValueError unless ``args.layer_types`` has one of ``kinds`` per layer."""
    found = list(args.layer_types)
    unknown = sorted(set(found) - set(kinds))
    if unknown or len(found) != args.num_hidden_layers:
        raise ValueError(f"{args.model_type}: layer_types must list one of {', '.join(kinds)} "
                         f"for each of the {args.num_hidden_layers} layers; got {found}")
    if "sliding_attention" in found and not getattr(args, "sliding_window", None):
        raise ValueError(f"{args.model_type}: layer_types has sliding_attention layers "
                         "but no sliding_window")


def type_windows(layer_types, sliding_window):
    """Per-layer windows from Hugging Face's ``layer_types``: ``sliding_window`` on
    ``"sliding_attention"`` layers, None (global) on the others."""
    return [sliding_window if t == "sliding_attention" else None for t in layer_types]


def config_rope(args, dims, traditional=False):
    """RoPE over ``dims`` per head from the config's theta, scaling and context;
    ``traditional`` (the family's layout) or mlx-lm's ``rope_traditional`` field
    rotate interleaved pairs."""
    traditional = traditional or getattr(args, "rope_traditional", False)
    return make_rope(dims, args.rope_theta, traditional, args.rope_scaling,
                     args.max_position_embeddings)


def layer_type_rope(args, layer_type, default_partial=1.0):
    """The RoPE of one layer type (Laguna, MiMo-V2-Flash): its entry of transformers
    5's per-type ``rope_parameters`` (own theta, partial rotation and scaling), else
    the flat keys of transformers 4 (the sliding layers' theta as
    ``rope_local_base_freq``, one ``partial_rotary_factor``)."""
    params = (getattr(args, "rope_parameters_by_type", None) or {}).get(layer_type)
    if params is not None:
        theta = params.get("rope_theta", 10000.0)
        partial = params.get("partial_rotary_factor", default_partial)
        kind = params.get("rope_type", params.get("type", "default"))
        scaling = None if kind in (None, "default") else params
    else:
        sliding = layer_type == "sliding_attention"
        local = getattr(args, "rope_local_base_freq", None)
        theta = (local or args.rope_theta) if sliding else args.rope_theta
        partial = getattr(args, "partial_rotary_factor", None) or default_partial
        scaling = None if sliding else args.rope_scaling
    return make_rope(int(args.head_dim * partial), theta, False, scaling,
                     args.max_position_embeddings)


def init_causal_lm(model, args, layers, final_norm, layer_windows=None, head_bias=False,
                   **stack_kwargs):
    """Set what ``CausalLM`` reads: ``args``, ``model`` (a ``DecoderStack``), an
    ``lm_head`` unless tied, and ``layer_windows`` (default: all global).

    ``head_bias``: the head has a bias, and then exists even when its weight is tied
    (the bias has nowhere else to live; Phi, ERNIE 4.5 MoE)."""
    model.args = args
    model.model_type = args.model_type
    model.model = DecoderStack(args.vocab_size, args.hidden_size, layers, final_norm,
                               **stack_kwargs)
    if head_bias or not args.tie_word_embeddings:
        model.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=bool(head_bias))
    model.layer_windows = (list(layer_windows) if layer_windows is not None
                           else [None] * len(layers))
