"""ERNIE 4.5 (dense): llama blocks with interleaved ("traditional") RoPE and one
``use_bias`` flag for every attention and MLP projection."""

from dataclasses import dataclass

from . import llama
from .llama import Model  # noqa: F401


@dataclass
class ModelArgs(llama.ModelArgs):
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_traditional: bool = True
    use_bias: bool = False

    def __post_init__(self):
        self.attention_bias = self.mlp_bias = self.use_bias
