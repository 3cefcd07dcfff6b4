"""MiMo: Qwen 2 blocks; the checkpoint's multi-token-prediction modules
(``model.mtp_layers.*``) serve speculative decoding only and are dropped."""

from . import qwen2
from .qwen2 import ModelArgs  # noqa: F401  (same config fields)


class Model(qwen2.Model):
    def sanitize(self, weights):
        weights = {k: v for k, v in weights.items() if not k.startswith("model.mtp_layers.")}
        return super().sanitize(weights)
