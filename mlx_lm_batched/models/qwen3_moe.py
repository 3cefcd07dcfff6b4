"""Qwen 3 MoE: Qwen 2 MoE with QK-norm, one bias flag for all attention projections,
no shared expert, and (with ``use_sliding_window``) the window on every layer."""

from dataclasses import dataclass

from ..layers.attention_options import Projections, QKNorm
from ..layers.norms import RMSNorm
from . import qwen2_moe


@dataclass
class ModelArgs(qwen2_moe.ModelArgs):
    def layer_windows(self):
        window = self.sliding_window if self.use_sliding_window else None
        return [window] * self.num_hidden_layers


class Model(qwen2_moe.Model):
    def __init__(self, args: ModelArgs, layer_ropes=None):
        super().__init__(args, shared_expert=False, layer_ropes=layer_ropes, attention_kwargs=dict(
            projections=Projections(bias=args.attention_bias),
            qk_norm=QKNorm(lambda dims: RMSNorm(dims, args.rms_norm_eps)),
        ))
