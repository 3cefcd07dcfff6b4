"""dots.llm1 (``dots1``): GLM-4.5's MoE model with per-head QK-norm, full-width RoPE,
one bias flag for all four attention projections, and optional sliding-window layers
(``layer_types``, or every layer from ``max_window_layers`` on)."""

from dataclasses import dataclass
from typing import Optional

from . import glm4_moe


@dataclass
class ModelArgs(glm4_moe.ModelArgs):
    # dots.llm1 configs name the sigmoid router "noaux_tc" (mlx-lm 0.32's default is
    # the tuple ("noaux_tc",)): the same router.
    SCORING_FUNCS = ("sigmoid", "noaux_tc", ("noaux_tc",))
    scoring_func: str = "noaux_tc"
    partial_rotary_factor: float = 1.0
    first_k_dense_replace: int = 0
    norm_topk_prob: bool = False
    rms_norm_eps: float = 1e-6
    max_window_layers: Optional[int] = None

    def layer_windows(self):
        if self.layer_types is not None or self.sliding_window is None:
            return super().layer_windows()
        start = self.num_hidden_layers if self.max_window_layers is None else self.max_window_layers
        return [self.sliding_window if i >= start else None for i in range(self.num_hidden_layers)]


class Model(glm4_moe.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, qk_norm=True, o_bias=args.attention_bias)

    def sanitize(self, weights):
        # mlx-lm's conversions name the stacked experts mlp.experts.{gate,up,down}_proj.
        for k in [k for k in weights if ".mlp.experts." in k]:
            name = k.split(".mlp.experts.")[1]
            if name.split(".")[0] in ("gate_proj", "up_proj", "down_proj"):
                weights[k.replace(".mlp.experts.", ".mlp.switch_mlp.")] = weights.pop(k)
        return super().sanitize(weights)
