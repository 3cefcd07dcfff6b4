"""GLM (GLM-4-9B, ``glm``): llama pre-norm blocks with a fused ``gate_up_proj``,
biased q/k/v, and interleaved RoPE over the first ``partial_rotary_factor`` of each
head. (GLM 4 0414 adds sandwich norms: ``glm4.py``.)"""

from . import glm4
from .glm4 import ModelArgs  # noqa: F401  (the same config fields)


class Model(glm4.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args, sandwich=False)
