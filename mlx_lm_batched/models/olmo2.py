"""OLMo 2: norms after attention and MLP outputs only (no pre-norms), and RMS
QK-norm over the whole q/k projections before they are split into heads."""

from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from .base import BaseModelArgs
from .layers import MLP, Attention, CausalLM, DecoderStack, RMSNorm, SandwichBlock
from .rope import make_rope

POST_NORMS = (None, "post_attention_layernorm", None, "post_feedforward_layernorm")


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: Optional[int] = None
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    hidden_act: str = "silu"
    attention_bias: bool = False
    tie_word_embeddings: bool = False


def build_layers(args, ropes):
    """One post-norm block per layer; ``ropes[i]`` is layer ``i``'s rotary embedding."""
    n_kv = args.num_key_value_heads or args.num_attention_heads
    head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
    norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps)
    return [
        SandwichBlock(
            Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim, rope,
                      bias=args.attention_bias, qk_norm=norm, qk_norm_full=True),
            MLP(args.hidden_size, args.intermediate_size, args.hidden_act),
            norm,
            norm_names=POST_NORMS,
        )
        for rope in ropes
    ], norm


class Model(CausalLM):
    def __init__(self, args: ModelArgs, ropes=None, layer_windows=None):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        if ropes is None:
            head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
            rope = make_rope(head_dim, args.rope_theta, False, args.rope_scaling,
                             args.max_position_embeddings)
            ropes = [rope] * args.num_hidden_layers
        layers, norm = build_layers(args, ropes)
        self.model = DecoderStack(args.vocab_size, args.hidden_size, layers, norm())
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_windows = layer_windows or [None] * args.num_hidden_layers
