"""Llama 4 text model: pre-norm blocks whose attention layers come in two kinds.

- RoPE layers (``no_rope_layers[i] == 1``; by default three of every four) rotate
  q/k with interleaved pairs, L2-normalise them after the rotation (``use_qk_norm``)
  and attend only keys of the query's own chunk of ``attention_chunk_size``
  positions (``layer_types`` "chunked_attention"): a chunk mask from the one mask
  path, and a ring cache of ``attention_chunk_size`` slots, which is exact since a
  query never looks further back than that.
- NoPE layers (every ``no_rope_layer_interval``-th) use no position encoding and
  attend every earlier key; with ``attn_temperature_tuning`` their queries are scaled
  by ``1 + attn_scale * log(1 + floor((position + 1) / floor_scale))`` of each row's
  own positions (transformers counts cached slots; for one sequence that is the same).

Feed-forward: MoE layers (``moe_layers``, by default every
``interleave_moe_layer_step``-th) route each token to its top-k experts, whose
sigmoid router score scales the expert's input, plus a shared expert; the other
layers are dense MLPs of ``intermediate_size_mlp``.
"""

from dataclasses import dataclass
from functools import partial
from typing import Optional

import mlx.core as mx

from ..layers.attention import Attention
from ..layers.attention_options import Projections, QKNorm, Scores
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP, activation
from ..layers.moe import InputScaledMoE
from ..layers.norms import RMSNorm
from ..layers.stack import CausalLM
from .common import DecoderArgs, attention_dims, config_rope, init_causal_lm


@dataclass
class ModelArgs(DecoderArgs):
    num_key_value_heads: Optional[int] = 8
    head_dim: Optional[int] = 128
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    intermediate_size_mlp: int = 16384
    num_local_experts: int = 16
    num_experts_per_tok: int = 1
    moe_layers: Optional[list] = None
    interleave_moe_layer_step: int = 1
    use_qk_norm: bool = True
    no_rope_layers: Optional[list] = None
    no_rope_layer_interval: int = 4
    attention_chunk_size: Optional[int] = 8192
    layer_types: Optional[list] = None
    attn_temperature_tuning: bool = True
    floor_scale: int = 8192
    attn_scale: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        n = self.num_hidden_layers
        # transformers' defaults (an empty list counts as absent there too).
        if not self.no_rope_layers:
            self.no_rope_layers = [int((i + 1) % self.no_rope_layer_interval != 0)
                                   for i in range(n)]
        if self.moe_layers is None:
            step = self.interleave_moe_layer_step
            self.moe_layers = list(range(step - 1, n, step))
        if self.layer_types is None:
            chunked = self.attention_chunk_size is not None
            self.layer_types = ["chunked_attention" if rope and chunked else "full_attention"
                                for rope in self.no_rope_layers]

    def layer_chunks(self):
        """Attention chunk per layer (None on full-attention layers)."""
        return [self.attention_chunk_size if t == "chunked_attention" else None
                for t in self.layer_types]


def temperature_factor(positions, attn_scale, floor_scale):
    """Query factor of the NoPE layers at ``positions`` (transformers' attention
    temperature tuning)."""
    return 1 + attn_scale * mx.log1p(mx.floor((positions + 1) / floor_scale))


def temperature_scale(attn_scale, floor_scale):
    """Position -> query factor; a ``partial`` of a module function, so models copy."""
    return partial(temperature_factor, attn_scale=attn_scale, floor_scale=floor_scale)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        n_kv, head_dim = attention_dims(args)
        rope = config_rope(args, head_dim, traditional=True)  # complex (interleaved) pairs
        norm = lambda: RMSNorm(args.hidden_size, args.rms_norm_eps)
        l2_norm = lambda dims: RMSNorm(dims, args.rms_norm_eps, affine=False)
        act = activation(args.hidden_act)
        tuning = (temperature_scale(args.attn_scale, args.floor_scale)
                  if args.attn_temperature_tuning else None)
        layers = []
        for i in range(args.num_hidden_layers):
            use_rope = bool(args.no_rope_layers[i])
            attn = Attention(args.hidden_size, args.num_attention_heads, n_kv, head_dim,
                             rope if use_rope else None,
                             qk_norm=(QKNorm(l2_norm, after_rope=True)
                                      if use_rope and args.use_qk_norm else None),
                             projections=Projections(bias=args.attention_bias),
                             scores=Scores(position_scale=None if use_rope else tuning))
            if i in args.moe_layers:
                ffn = InputScaledMoE(args.hidden_size, args.intermediate_size,
                                     args.num_local_experts, args.num_experts_per_tok,
                                     MLP(args.hidden_size, args.intermediate_size, act), act)
            else:
                ffn = MLP(args.hidden_size, args.intermediate_size_mlp, act)
            layers.append(PreNormBlock(attn, ffn, norm, mlp_name="feed_forward"))
        init_causal_lm(self, args, layers, norm())
        self.layer_chunks = args.layer_chunks()

    def sanitize(self, weights):
        """Split Hugging Face's fused experts (``experts.gate_up_proj`` ``(E, hidden,
        2 * inter)``, gate first; ``experts.down_proj`` ``(E, inter, hidden)``) into
        the ``SwitchGLU``'s ``(E, out, in)`` weights; stacked names pass unchanged."""
        weights = super().sanitize(weights)
        for key in [k for k in weights if k.endswith(".feed_forward.experts.gate_up_proj")]:
            gate, up = mx.split(weights.pop(key), 2, axis=-1)
            weights[f"{key[:-len('gate_up_proj')]}gate_proj.weight"] = gate.swapaxes(1, 2)
            weights[f"{key[:-len('gate_up_proj')]}up_proj.weight"] = up.swapaxes(1, 2)
        for key in [k for k in weights if k.endswith(".feed_forward.experts.down_proj")]:
            weights[f"{key}.weight"] = weights.pop(key).swapaxes(1, 2)
        return weights
