"""GPT-2: learned absolute positions, biased LayerNorms, a fused ``c_attn`` and an
ungated MLP, all stored by Hugging Face as ``Conv1D`` (``(in, out)`` weights)."""

import re
from dataclasses import dataclass
from typing import Optional

import mlx.nn as nn

from ..layers.attention import Attention
from ..layers.attention_options import Projections, Scores
from ..layers.blocks import PreNormBlock
from ..layers.mlp import DenseMLP
from ..layers.norms import LayerNorm
from ..layers.stack import CausalLM, DecoderStack
from .args import BaseModelArgs

# Hugging Face (``transformer.`` prefix optional) -> our names.
_RENAMES = [
    (r"^wte\.", "model.embed_tokens."),
    (r"^wpe\.", "model.embed_positions."),
    (r"^ln_f\.", "model.norm."),
    (r"^h\.(\d+)\.attn\.c_attn\.", r"model.layers.\1.self_attn.qkv_proj."),
    (r"^h\.(\d+)\.attn\.c_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^h\.(\d+)\.", r"model.layers.\1."),
]
_CONV1D = re.compile(r"\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str
    n_embd: int
    n_layer: int
    n_head: int
    vocab_size: int
    n_positions: Optional[int] = None  # 1024 when neither it nor n_ctx is given
    n_inner: Optional[int] = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    tie_word_embeddings: bool = True
    n_ctx: Optional[int] = None  # older configs' name of n_positions
    num_key_value_heads: Optional[int] = None  # mlx-lm's field; GPT-2 has no GQA

    def __post_init__(self):
        # transformers reads n_positions; old configs also carry n_ctx (usually equal).
        self.n_positions = self.n_positions or self.n_ctx or 1024
        if self.num_key_value_heads not in (None, self.kv_heads()):
            raise NotImplementedError(f"{self.model_type}: num_key_value_heads="
                                      f"{self.num_key_value_heads} is not supported; this "
                                      f"architecture has {self.kv_heads()} KV heads")

    def kv_heads(self):
        """The number of KV heads the architecture has (GPT-2: one per head)."""
        return self.n_head


class Model(CausalLM):
    def __init__(self, args: ModelArgs, n_kv_heads=None):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        d = args.n_embd
        head_dim = d // args.n_head
        norm = lambda: LayerNorm(d, args.layer_norm_epsilon)
        layers = []
        for i in range(args.n_layer):
            scale = head_dim**-0.5 if args.scale_attn_weights else 1.0
            if args.scale_attn_by_inverse_layer_idx:
                scale /= i + 1
            attn = Attention(d, args.n_head, n_kv_heads or args.n_head, head_dim,
                             projections=Projections(bias=True, fused_qkv=True),
                             scores=Scores(scale=scale))
            mlp = DenseMLP(d, args.n_inner or 4 * d, args.activation_function,
                           names=("c_fc", "c_proj"))
            layers.append(PreNormBlock(attn, mlp, norm, norm_names=("ln_1", "ln_2")))
        self.model = DecoderStack(args.vocab_size, d, layers, norm(),
                                  max_positions=args.n_positions)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(d, args.vocab_size, bias=False)
        self.layer_windows = [None] * args.n_layer

    def sanitize(self, weights):
        out = {}
        for k, v in weights.items():
            if k.endswith((".attn.bias", ".attn.masked_bias")):
                continue  # causal-mask buffers
            # mlx-lm conversions say ``model.h.*`` and are already transposed;
            # Hugging Face checkpoints (``h.*`` / ``transformer.h.*``) are Conv1D.
            converted = k.startswith("model.")
            name = re.sub(r"^(transformer|model)\.", "", k)
            if not converted:
                v = self._from_checkpoint(name, v)
            for pattern, repl in _RENAMES:
                name, n = re.subn(pattern, repl, name)
                if n:
                    break
            out[name if name.startswith(("model.", "lm_head.")) else k] = v
        return super().sanitize(out)

    def _from_checkpoint(self, name, v):
        """A Hugging Face tensor (by its checkpoint name) -> our layout."""
        return v.T if _CONV1D.search(name) else v
