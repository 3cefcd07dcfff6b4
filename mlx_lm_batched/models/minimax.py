"""MiniMax (MiniMax-Text-01): a hybrid of lightning attention (linear attention with a
per-head exponential decay, ``StateCache``) and softmax attention (``KVCache``, an
optional sliding window) chosen per layer by ``layer_types``, Mixtral's MoE in every
layer, and MiniMax's blocks (residuals taken after the norms, weighed by the
``*_alpha_factor``/``*_beta_factor`` pairs). A config whose layers are all
``full_attention`` has no state layer at all.

mlx-lm's ``minimax`` module is MiniMax-M2 (softmax attention only, no ``layer_types``):
a config in its layout (``rotary_dim``, no ``layer_types``) builds our ``minimax_m2``
model, as mlx-lm would load it."""

from dataclasses import dataclass
from typing import List, Optional

from ..cache.state import StateCache
from ..layers.attention import Attention
from ..layers.lightning import LightningAttention
from ..layers.mlp import activation
from ..layers.moe import SparseMoE
from ..layers.norms import RMSNorm
from ..layers.ssm import NormedResidualBlock
from ..layers.stack import CausalLM
from . import minimax_m2
from .common import DecoderArgs, config_rope, init_causal_lm
from .mixtral import stack_mixtral_experts

LAYER_TYPES = ("full_attention", "linear_attention")


@dataclass
class ModelArgs(DecoderArgs):
    num_key_value_heads: Optional[int] = 8
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    sliding_window: Optional[int] = None
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    layer_types: Optional[List[str]] = None
    block_size: int = 256
    full_attn_alpha_factor: float = 1.0
    full_attn_beta_factor: float = 1.0
    linear_attn_alpha_factor: float = 1.0
    linear_attn_beta_factor: float = 1.0
    mlp_alpha_factor: float = 1.0
    mlp_beta_factor: float = 1.0

    def __new__(cls, *args, **kwargs):
        # mlx-lm's ``minimax`` fields (its MiniMax-M2 layout) build MiniMax-M2's args, as
        # from_dict does. (copy and pickle call __new__ without arguments.)
        if cls is ModelArgs and not args and is_mlx_lm_layout(kwargs):
            return minimax_m2.ModelArgs(**kwargs)
        return super().__new__(cls)

    @classmethod
    def from_dict(cls, params):
        """These args, or ``minimax_m2``'s for a config in mlx-lm's ``minimax`` layout."""
        if is_mlx_lm_layout(params):
            return minimax_m2.ModelArgs.from_dict(params)
        return super().from_dict(params)

    def __post_init__(self):
        super().__post_init__()
        n = self.num_hidden_layers
        if self.layer_types is None:  # transformers' default: softmax on even layers
            self.layer_types = [LAYER_TYPES[i % 2] for i in range(n)]
        if not set(self.layer_types) <= set(LAYER_TYPES) or len(self.layer_types) != n:
            raise ValueError(f"layer_types must list {n} entries from {LAYER_TYPES}, "
                             f"got {self.layer_types}")


def is_mlx_lm_layout(params):
    """True for mlx-lm's MiniMax(-M2) config: ``rotary_dim`` (a field it requires) and
    no ``layer_types``, every layer softmax attention (``attn_type_list`` all 1)."""
    types = params.get("attn_type_list") or [1]
    return ("layer_types" not in params and "rotary_dim" in params
            and all(t == 1 for t in types))


class Model(CausalLM):
    def __new__(cls, args=None):
        # A config in mlx-lm's layout (see ModelArgs.from_dict) is MiniMax-M2.
        # (copy and pickle call __new__ without arguments, then restore the state.)
        if isinstance(args, minimax_m2.ModelArgs):
            return minimax_m2.Model(args)
        return super().__new__(cls)

    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        act = activation(args.hidden_act)
        layers = []
        for i, kind in enumerate(args.layer_types):
            if kind == "linear_attention":
                mixer = LightningAttention(args.hidden_size, args.num_attention_heads,
                                           args.head_dim, i, args.num_hidden_layers,
                                           args.hidden_act, args.block_size)
                factors = (args.linear_attn_alpha_factor, args.linear_attn_beta_factor)
            else:
                mixer = Attention(args.hidden_size, args.num_attention_heads,
                                  args.num_key_value_heads, args.head_dim, rope)
                factors = (args.full_attn_alpha_factor, args.full_attn_beta_factor)
            moe = SparseMoE(args.hidden_size, args.intermediate_size, args.num_local_experts,
                            args.num_experts_per_tok, act, normalize=True)
            layers.append(NormedResidualBlock(
                mixer, moe, norm, factors + (args.mlp_alpha_factor, args.mlp_beta_factor),
                names=("self_attn", "block_sparse_moe", "input_layernorm",
                       "post_attention_layernorm")))
        windows = [args.sliding_window if kind == "full_attention" else None
                   for kind in args.layer_types]
        init_causal_lm(self, args, layers, norm(), windows)

    def make_cache(self, max_kv_size=None):
        """A ``StateCache`` per lightning layer, the shared key/value caches (rotating
        with a window or ``max_kv_size``) for the softmax ones."""
        caches = super().make_cache(max_kv_size)
        return [StateCache(1) if kind == "linear_attention" else c
                for kind, c in zip(self.args.layer_types, caches)]

    def sanitize(self, weights):
        # transformers saves the lightning layers' decay tables (derived from the
        # layer index here) as buffers.
        buffers = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")
        weights = {k.replace(".mlp.", ".block_sparse_moe."): v for k, v in weights.items()
                   if k.rsplit(".", 1)[-1] not in buffers}  # (and its in-memory MoE name)
        return stack_mixtral_experts(super().sanitize(weights), self.args)
