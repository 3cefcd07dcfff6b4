"""Solar Open (Upstage): GLM-4.5's MoE decoder (sigmoid router with a correction
bias, shared experts) with Llama's attention: every layer MoE, whole-head RoPE,
no QK-norm, unbiased projections. Checkpoints carry no ``intermediate_size`` (no
dense layer uses it)."""

from dataclasses import dataclass

from . import glm4_moe


@dataclass
class ModelArgs(glm4_moe.ModelArgs):
    rope_theta: float = 1_000_000.0
    first_k_dense_replace: int = 0
    partial_rotary_factor: float = 1.0
    moe_intermediate_size: int = 1280

    @classmethod
    def from_dict(cls, params):
        # No dense MLP exists unless first_k_dense_replace says so; its width then
        # defaults to the experts' (the field is required by the shared args).
        params = dict(params)
        params.setdefault("intermediate_size", params.get("moe_intermediate_size", 1280))
        return super().from_dict(params)


class Model(glm4_moe.Model):
    pass
