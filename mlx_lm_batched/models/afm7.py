"""AFM 7 (Apple's on-device foundation model): pre-norm blocks with a fused
``qkv_proj``, traditional RoPE then per-head RMS QK-norm, keys and values rounded to
8-bit steps of a learned scale (``quant_key_scale``, ``quant_value_scale``) before the
cache; the last ``num_kv_reuse_layers`` layers compute queries only and attend the
keys and values of the last regular layer (``layers/kv_sharing.py``, so only the
regular layers have caches). Tied embeddings."""

from dataclasses import dataclass

import mlx.core as mx

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm
from ..layers.blocks import PreNormBlock
from ..layers.kv_sharing import SharedKVAttention, layer_inputs
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM, DecoderStack
from .args import BaseModelArgs

# mlx-lm's names -> ours.
RENAMES = (("model.embedding.", "model.embed_tokens."), ("model.output_norm.", "model.norm."),
           (".self_attn.out_proj.", ".self_attn.o_proj."))


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    vocab_size: int
    hidden_dim: int
    num_layers: int
    num_kv_reuse_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_dim_scale_factor: float = 3.25
    rope_theta: float = 50000.0
    rms_norm_eps: float = 1e-5

    def __post_init__(self):
        if not 0 <= self.num_kv_reuse_layers < self.num_layers:
            raise ValueError(f"afm7: num_kv_reuse_layers must be in [0, {self.num_layers - 1}], "
                             f"got {self.num_kv_reuse_layers}")


def fake_8bit(x, scale):
    """``x`` rounded to the nearest of 256 steps of ``scale`` (int8 range), in float32."""
    q = mx.clip(mx.round(x.astype(mx.float32) / scale.astype(mx.float32)), -128, 127)
    return (q * scale.astype(mx.float32)).astype(x.dtype)


class QuantizedKVAttention(Attention):
    """The shared attention whose keys (after norm and RoPE) and values are rounded
    to 8-bit steps before they are cached."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.quant_key_scale = mx.array(1.0)
        self.quant_value_scale = mx.array(1.0)

    def project(self, x):
        q, k, v = super().project(x)
        return q, k, fake_8bit(v, self.quant_value_scale)

    def _heads(self, t, which, offset):
        t = super()._heads(t, which, offset)
        return fake_8bit(t, self.quant_key_scale) if which == 1 else t


class KVReuseStack(DecoderStack):
    """The decoder stack wiring the reuse layers to the last regular layer's keys
    and values (caches and masks exist for the regular layers only)."""

    def __init__(self, *args, sources, **kwargs):
        super().__init__(*args, **kwargs)
        self.sources = sources

    def __call__(self, inputs, masks, offset, cache, input_embeddings=None, attention=None):
        h = self.embed(inputs, offset, input_embeddings)
        extra = () if attention is None else (attention,)
        for layer, (m, c) in zip(self.layers, layer_inputs(self.sources, cache, masks)):
            h = layer(h, m, offset, c, *extra)
        return self.norm(h)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        d, heads, kv = args.hidden_dim, args.num_heads, args.num_kv_heads
        head_dim = d // heads
        rope = make_rope(head_dim, args.rope_theta, True)
        qk_norm = lambda dims: RMSNorm(dims, 1e-5)
        norm = lambda: RMSNorm(d, args.rms_norm_eps)
        regular = args.num_layers - args.num_kv_reuse_layers
        sources = list(range(regular)) + [regular - 1] * args.num_kv_reuse_layers
        layers = []
        for i in range(args.num_layers):
            kind = QuantizedKVAttention if i < regular else SharedKVAttention
            projections = Projections(fused_qkv=i < regular)
            attn = kind(d, heads, kv, head_dim, rope, qk_norm=QKNorm(qk_norm, after_rope=True),
                        projections=projections)
            layers.append(PreNormBlock(attn, MLP(d, int(d * args.hidden_dim_scale_factor)), norm))
        self.model = KVReuseStack(args.vocab_size, d, layers, norm(), sources=sources)
        self.layer_windows = [None] * regular

    def sanitize(self, weights):
        regular = self.args.num_layers - self.args.num_kv_reuse_layers
        out = {}
        for k, v in weights.items():
            for old, new in RENAMES:
                k = k.replace(old, new)
            if k.startswith("model.kv_reuse_layers."):
                j, rest = k[len("model.kv_reuse_layers."):].split(".", 1)
                k = f"model.layers.{regular + int(j)}.{rest}"
            out[k] = v
        return super().sanitize(out)
