"""BitNet b1.58 (Microsoft): Llama's blocks with a ReLU² gated MLP and two extra
RMS norms: ``attn_sub_norm`` on the attention heads' output before ``o_proj`` and
``ffn_sub_norm`` on the MLP's hidden state before ``down_proj``.

A ``quantization_config`` with ``quant_method: "bitnet"`` (the released checkpoints,
ternary weights packed four to a byte) swaps the linear layers for the shared
:class:`~..layers.bitlinear.BitLinear`; without one (the ``-bf16`` checkpoints) they
stay dense. Online quantization (weights quantized while running) is refused."""

from dataclasses import dataclass
from typing import Optional

from ..layers.attention import Attention
from ..layers.bitlinear import to_bitlinear
from ..layers.mlp import MLP
from ..layers.norms import RMSNorm
from . import llama


@dataclass
class ModelArgs(llama.ModelArgs):
    hidden_act: str = "relu2"
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    quantization_config: Optional[dict] = None

    def __post_init__(self):
        super().__post_init__()
        qc = self.quantization_config or {}
        if qc.get("quant_method") == "bitnet" and qc.get("quantization_mode") == "online":
            raise NotImplementedError("bitnet: online quantization_mode is not supported "
                                      "(offline, packed ternary weights are)")


class SubNormAttention(Attention):
    """Attention whose concatenated head outputs are RMS-normed before ``o_proj``."""

    def __init__(self, *args, sub_norm, **kwargs):
        """``sub_norm``: a factory of the norm (one per layer)."""
        super().__init__(*args, **kwargs)
        self.attn_sub_norm = sub_norm()

    def output(self, h):
        return self.o_proj(self.attn_sub_norm(h))


class SubNormMLP(MLP):
    """``down(ffn_sub_norm(act(gate(x)) * up(x)))``."""

    def __init__(self, hidden_size, intermediate_size, act, bias, sub_norm):
        super().__init__(hidden_size, intermediate_size, act, bias)
        self.ffn_sub_norm = sub_norm

    def __call__(self, x):
        return self.down_proj(self.ffn_sub_norm(self.act(self.gate_proj(x)) * self.up_proj(x)))


class Model(llama.Model):
    def __init__(self, args: ModelArgs):
        norm = lambda dims: RMSNorm(dims, args.rms_norm_eps)
        heads = args.num_attention_heads * args.head_dim
        super().__init__(
            args, attention_kwargs=dict(sub_norm=lambda: norm(heads)),
            attention_class=SubNormAttention,
            mlp=lambda: SubNormMLP(args.hidden_size, args.intermediate_size, args.hidden_act,
                                   args.mlp_bias, norm(args.intermediate_size)))
        qc = args.quantization_config or {}
        if qc.get("quant_method") == "bitnet":
            to_bitlinear(self, qc)
