"""Qwen3.5 (dense and MoE): Qwen3-Next's hybrid with separate linear-attention
projections (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``). Multimodal
checkpoints (``qwen3_5``/``qwen3_5_moe``) nest the text settings in ``text_config`` and
prefix the language model's weights with ``model.language_model.``; the vision tower
and multi-token-prediction weights are ignored, and the multimodal RoPE of a text-only
prompt is plain RoPE."""

from dataclasses import dataclass

from . import qwen3_next
from .multimodal import accepts_text_config

_IGNORED = ("model.visual.", "visual.", "mtp.")


@accepts_text_config
@dataclass
class ModelArgs(qwen3_next.ModelArgs):
    @classmethod
    def from_dict(cls, params):
        text = params.get("text_config")
        if isinstance(text, dict):  # multimodal config: the text model's settings
            params = {**params, **text, "model_type": params.get("model_type")}
        if "intermediate_size" not in params and "moe_intermediate_size" in params:
            # Qwen3.5-MoE configs have no dense MLP size: every layer is a mixture of
            # experts, so the dense size is never used (the expert size stands in).
            params = {**params, "intermediate_size": params["moe_intermediate_size"]}
        return super().from_dict(params)


class Model(qwen3_next.Model):
    fused_projections = False

    def sanitize(self, weights):
        out = {}
        for k, v in weights.items():
            if k.startswith(_IGNORED):
                continue
            out[k.replace("model.language_model.", "model.", 1)] = v
        return super().sanitize(out)
