"""nanochat (Karpathy): weightless RMS norms everywhere (after the embedding, before
attention and MLP, on the rotated queries and keys, and before the head), a ReLU²
MLP (``fc1``/``fc2``), an untied head and soft-capped logits (15).

Two checkpoint layouts load: transformers' (``model.layers.{i}.self_attn.q_proj``,
``mlp.fc1`` ...) and nanochat's own, which mlx-lm reads (``transformer.h.{i}.attn.c_q``,
``mlp.c_fc`` ...). Both rotate by the negated angle (transformers' ``rotate_half``
for nanochat flips the signs): the shared RoPE with negated wavelengths."""

import re
from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.mlp import DenseMLP
from ..layers.norms import RMSNorm
from ..layers.rope import negated_rope
from ..layers.stack import CausalLM, DecoderStack
from .common import DecoderArgs, init_causal_lm

# nanochat's own names -> ours.
_RENAMES = [
    (r"^transformer\.wte\.", "model.embed_tokens."),
    (r"^transformer\.h\.(\d+)\.attn\.c_([qkv])\.", r"model.layers.\1.self_attn.\2_proj."),
    (r"^transformer\.h\.(\d+)\.attn\.c_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^transformer\.h\.(\d+)\.mlp\.c_fc\.", r"model.layers.\1.mlp.fc1."),
    (r"^transformer\.h\.(\d+)\.mlp\.c_proj\.", r"model.layers.\1.mlp.fc2."),
]


@dataclass
class ModelArgs(DecoderArgs):
    vocab_size: int = 50304
    hidden_act: str = "relu2"
    rms_norm_eps: float = 1e-6
    final_logit_softcapping: Optional[float] = 15.0
    attention_bias: bool = False


class EmbedNormStack(DecoderStack):
    """The decoder stack with its (weightless) final norm also applied to the
    embeddings."""

    def embed(self, inputs, offset, input_embeddings=None):
        return self.norm(super().embed(inputs, offset, input_embeddings))


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        if args.rope_scaling is not None:
            raise NotImplementedError("nanochat: rope_scaling is not supported")
        rope = negated_rope(args.head_dim, args.rope_theta)
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps, affine=False)
        layers = [
            PreNormBlock(
                Attention(args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                          args.head_dim, rope, qk_norm=QKNorm(norm, after_rope=True),
                          projections=Projections(bias=args.attention_bias)),
                DenseMLP(args.hidden_size, args.intermediate_size, args.hidden_act, bias=False,
                         names=("fc1", "fc2")),
                norm,
            )
            for _ in range(args.num_hidden_layers)
        ]
        init_causal_lm(self, args, layers, norm())
        self.model = EmbedNormStack(args.vocab_size, args.hidden_size, layers, norm())
        self.final_logit_softcap = args.final_logit_softcapping

    def sanitize(self, weights):
        out = {}
        for k, v in weights.items():
            name = k
            for pattern, repl in _RENAMES:
                name, n = re.subn(pattern, repl, name)
                if n:
                    break
            out[name] = v
        return super().sanitize(out)

