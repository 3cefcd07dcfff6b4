"""MiniCPM: Granite's four scalar knobs under MiniCPM's names — embeddings times
``scale_emb``, each residual branch times ``scale_depth / sqrt(num_hidden_layers)``,
logits divided by ``hidden_size / dim_model_base`` (tied or not, as the reference
modelling code does)."""

from dataclasses import dataclass
from typing import Optional

from . import granite


@dataclass
class ModelArgs(granite.ModelArgs):
    scale_emb: float = 1.0
    scale_depth: float = 1.0
    dim_model_base: Optional[int] = None
    rope_theta: float = 1000000.0

    def __post_init__(self):
        super().__post_init__()
        self.embedding_multiplier = self.scale_emb
        self.residual_multiplier = self.scale_depth / self.num_hidden_layers**0.5
        self.attention_multiplier = self.head_dim**-0.5
        self.logits_scaling = self.hidden_size / (self.dim_model_base or self.hidden_size)


Model = granite.Model
