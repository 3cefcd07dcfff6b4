"""GPT-BigCode (SantaCoder, StarCoder 1): GPT-2 blocks with ``nn.Linear`` weights and
multi-query attention (one key/value head) in the fused ``c_attn``."""

from dataclasses import dataclass

from . import gpt2
from .args import require_values
from .gpt_neox import per_head_qkv_to_fused


@dataclass
class ModelArgs(gpt2.ModelArgs):
    activation_function: str = "gelu_pytorch_tanh"
    multi_query: bool = True
    attention_bias: bool = True  # mlx-lm's fields: GPT-BigCode layers always have biases
    mlp_bias: bool = True

    def __post_init__(self):
        super().__post_init__()
        require_values(self, attention_bias=(True,), mlp_bias=(True,))

    def kv_heads(self):
        return 1 if self.multi_query else self.n_head


class Model(gpt2.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, n_kv_heads=1 if args.multi_query else args.n_head)

    def _from_checkpoint(self, name, v):
        # Multi-query c_attn rows are q, k, v already; otherwise interleaved per head.
        if not self.args.multi_query and ".attn.c_attn." in name:
            return per_head_qkv_to_fused(v, self.args.n_head)
        return v
