"""InternLM 3: llama blocks; the hub config's ``qkv_bias`` biases q/k/v and ``bias``
the output and MLP projections (transformers 5 names them ``attention_bias`` and
``mlp_bias``)."""

from dataclasses import dataclass
from typing import Optional

from . import llama


@dataclass
class ModelArgs(llama.ModelArgs):
    qkv_bias: Optional[bool] = None
    bias: Optional[bool] = None
    tie_word_embeddings: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.qkv_bias is not None:
            self.attention_bias = self.qkv_bias
        if self.bias is not None:
            self.attention_out_bias = self.mlp_bias = self.bias
        elif self.attention_out_bias is None:
            self.attention_out_bias = self.attention_bias


Model = llama.Model
