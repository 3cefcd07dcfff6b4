"""Muse Glimmer (Meta; the language model of its multimodal checkpoint, text input
only: the vision tower and adapter are ignored). Gemma-2-style sandwich blocks with
zero-centred norms (the post-norms with ``post_norm_eps``); embeddings RMS-normed
without weight; attention with weightless QK-norm (queries times
``qk_scale_factor``), a sigmoid output gate (``gate_proj``), RoPE except on the
layers whose ``layer_rope_theta`` is 0 (every 4th from the last, global; the others
slide); logits times ``output_multiplier``, then soft-capped."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx

from ..layers.attention import OutputGatedAttention
from ..layers.attention_options import QKNorm, Scores
from ..layers.blocks import SandwichBlock
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM, DecoderStack
from .common import DecoderArgs, config_rope, init_causal_lm, type_windows
from .multimodal import TextConfigArgs, accepts_text_config, check_text_model_type, language_model_weights


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, DecoderArgs):
    vocab_size: int = 202048
    num_key_value_heads: Optional[int] = 2
    head_dim: Optional[int] = 128
    max_position_embeddings: Optional[int] = 131072
    rms_norm_eps: float = 1e-5
    post_norm_eps: float = 1e-8
    sliding_window: Optional[int] = 2048
    layer_types: Optional[List[str]] = None
    layer_rope_theta: Optional[List[float]] = None
    qk_scale_factor: float = 3.87
    hidden_activation: str = "silu"
    final_logit_softcapping: float = 20.0
    output_multiplier: float = 0.19611613513818404
    text_model_type: Optional[str] = None

    def __post_init__(self):
        super().__post_init__()
        check_text_model_type(self, ("muse_glimmer_text",))
        n = self.num_hidden_layers
        if self.layer_types is None:
            self.layer_types = ["full_attention" if (n - 1 - i) % 4 == 0 else "sliding_attention"
                                for i in range(n)]
        if self.layer_rope_theta is None:
            self.layer_rope_theta = [0 if (n - 1 - i) % 4 == 0 else self.rope_theta
                                     for i in range(n)]


class NormedEmbeddingStack(DecoderStack):
    """The decoder stack whose embeddings are RMS-normed (no weight)."""

    def __init__(self, *args, embed_eps, **kwargs):
        super().__init__(*args, **kwargs)
        self.embed_eps = embed_eps

    def embed(self, inputs, offset, input_embeddings=None):
        h = super().embed(inputs, offset, input_embeddings)
        return mx.fast.rms_norm(h, None, self.embed_eps)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        rope = config_rope(args, args.head_dim)
        qk_norm = lambda dims: RMSNorm(dims, args.rms_norm_eps, affine=False)
        # Weightless QK-norm, queries times qk_scale_factor: a factor on the logits.
        scale = args.head_dim**-0.5 * args.qk_scale_factor

        def sandwich_norms():
            # SandwichBlock builds its norms in order: pre, post, pre, post.
            eps = iter([args.rms_norm_eps, args.post_norm_eps] * 2)
            return lambda: RMSNorm(args.hidden_size, next(eps), zero_centered=True)

        layers = [
            SandwichBlock(
                OutputGatedAttention(args.hidden_size, args.num_attention_heads,
                                     args.num_key_value_heads, args.head_dim,
                                     rope if theta else None, qk_norm=QKNorm(qk_norm),
                                     scores=Scores(scale=scale)),
                MLP(args.hidden_size, args.intermediate_size, args.hidden_activation),
                sandwich_norms(),
            )
            for theta in args.layer_rope_theta
        ]
        init_causal_lm(self, args, layers, RMSNorm(args.hidden_size, args.rms_norm_eps),
                       type_windows(args.layer_types, args.sliding_window))
        self.model = NormedEmbeddingStack(args.vocab_size, args.hidden_size, layers,
                                          self.model.norm, embed_eps=args.rms_norm_eps)
        self.logit_scale = args.output_multiplier
        self.final_logit_softcap = args.final_logit_softcapping

    def sanitize(self, weights):
        weights = {k: v for k, v in weights.items()
                   if not any(part.startswith("vision_") for part in k.split("."))}
        return super().sanitize(language_model_weights(weights))
