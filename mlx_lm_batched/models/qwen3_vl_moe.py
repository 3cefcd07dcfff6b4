"""Qwen 3 VL MoE: the Qwen 3 MoE text model under ``text_config`` and
``model.language_model.``, without the ``visual`` tower; M-RoPE reduces to plain RoPE
on text; the router always renormalises. Hub checkpoints store the experts fused and transposed
(``gate_up_proj`` ``(E, hidden, 2I)``, ``down_proj`` ``(E, I, hidden)``); transformers'
own layout (``(E, 2I, hidden)``, ``(E, hidden, I)``) loads too."""

from dataclasses import dataclass

from . import qwen3_moe
from .multimodal import (
    TextConfigArgs,
    accepts_text_config,
    language_model_weights,
    text_rope_scaling,
)


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, qwen3_moe.ModelArgs):
    norm_topk_prob: bool = True  # the router always renormalises the chosen weights

    def __post_init__(self):
        super().__post_init__()
        self.rope_scaling = text_rope_scaling(self.rope_scaling)


class Model(qwen3_moe.Model):
    def sanitize(self, weights):
        weights = language_model_weights(weights)
        hidden, inter = self.args.hidden_size, self.args.moe_intermediate_size
        for key in list(weights):
            w = weights[key]
            if key.endswith(".mlp.experts.gate_up_proj") and w.shape[1:] == (hidden, 2 * inter):
                weights[key] = w.swapaxes(1, 2)
            elif key.endswith(".mlp.experts.down_proj") and w.shape[1:] == (inter, hidden):
                weights[key] = w.swapaxes(1, 2)
        return super().sanitize(weights)
