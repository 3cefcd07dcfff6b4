"""MiMo: Qwen 2 blocks; the checkpoint's multi-token-prediction modules
(``model.mtp_layers.*``) serve speculative decoding only and are dropped."""

from dataclasses import dataclass

from . import qwen2


@dataclass
class ModelArgs(qwen2.ModelArgs):
    num_nextn_predict_layers: int = 1  # multi-token-prediction modules, dropped at load


class Model(qwen2.Model):
    def sanitize(self, weights):
        weights = {k: v for k, v in weights.items() if not k.startswith("model.mtp_layers.")}
        return super().sanitize(weights)
