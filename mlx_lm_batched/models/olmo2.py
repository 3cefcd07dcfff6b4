"""OLMo 2: norms after attention and MLP outputs only (no pre-norms), and RMS
QK-norm over the whole q/k projections before they are split into heads."""

from dataclasses import dataclass

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import SandwichBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .args import require_values
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm

POST_NORMS = (None, "post_attention_layernorm", None, "post_feedforward_layernorm")


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    mlp_bias: bool = False  # mlx-lm's field; OLMo 2 MLPs have no bias

    def __post_init__(self):
        super().__post_init__()
        require_values(self, mlp_bias=(False,))


def build_layers(args, ropes):
    """One post-norm block per layer; ``ropes[i]`` is layer ``i``'s rotary embedding."""
    n_kv, head_dim = attention_dims(args)
    norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
    return [
        SandwichBlock(
            Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                      qk_norm=QKNorm(norm, full=True),
                      projections=Projections(bias=args.attention_bias)),
            MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
            norm,
            norm_names=POST_NORMS,
        )
        for rope in ropes
    ], norm


class Model(CausalLM):
    def __init__(self, args: ModelArgs, ropes=None, layer_windows=None):
        super().__init__()
        if ropes is None:
            ropes = [config_rope(args, attention_dims(args)[1])] * args.num_hidden_layers
        layers, norm = build_layers(args, ropes)
        init_causal_lm(self, args, layers, norm(), layer_windows or None)
