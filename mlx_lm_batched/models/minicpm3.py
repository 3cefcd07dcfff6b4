"""MiniCPM3: DeepSeek V2's multi-head latent attention (low-rank queries and one
compressed key/value latent) in llama blocks with MiniCPM's scalings: embeddings times
``scale_emb``, each residual branch times ``scale_depth / sqrt(num_hidden_layers)``,
logits divided by ``hidden_size / dim_model_base``. Unlike DeepSeek it rotates the
two halves of the rotary part (``rotate_half``), not adjacent pairs."""

from dataclasses import dataclass
from typing import Optional

from ..layers.blocks import PreNormBlock
from ..layers.mla import LatentDims, MultiHeadLatentAttention, mla_softmax_scale
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .common import DecoderArgs, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    rms_norm_eps: float = 1e-5
    kv_lora_rank: int = 256
    q_lora_rank: Optional[int] = 768
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 32
    v_head_dim: Optional[int] = None
    scale_emb: float = 12.0
    scale_depth: Optional[float] = 1.4
    dim_model_base: Optional[int] = 256
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self):
        super().__post_init__()
        # transformers' defaults for absent sizes and no-op scalings.
        if self.v_head_dim is None:
            self.v_head_dim = self.hidden_size // self.num_attention_heads
        if self.scale_depth is None:
            self.scale_depth = self.num_hidden_layers**0.5
        if self.dim_model_base is None:
            self.dim_model_base = self.hidden_size


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = make_rope(args.qk_rope_head_dim, args.rope_theta, args.rope_traditional, args.rope_scaling,
                         args.max_position_embeddings)
        scale = mla_softmax_scale(args.qk_nope_head_dim + args.qk_rope_head_dim, args.rope_scaling)
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        residual = args.scale_depth / args.num_hidden_layers**0.5
        layers = [
            PreNormBlock(
                MultiHeadLatentAttention(
                    args.hidden_size, args.num_attention_heads, LatentDims.from_args(args),
                    rope, scale, args.attention_bias),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_act, args.mlp_bias),
                norm,
                residual_scale=residual,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm(), embed_scale=args.scale_emb)
        # transformers divides the final hidden states by hidden_size / dim_model_base
        # before the (possibly tied) head: the same as scaling the logits.
        self.logit_scale = args.dim_model_base / args.hidden_size
