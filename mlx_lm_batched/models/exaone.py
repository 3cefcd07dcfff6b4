"""EXAONE 3 / 3.5: llama blocks under GPT-2-style names (``transformer.h.{i}.attn.attention``,
``mlp.c_fc_0``/``c_fc_1``/``c_proj``, ``ln_1``/``ln_2``) and config names
(``num_layers``, ``layer_norm_epsilon``, ``activation_function``), mapped to the
shared layers'."""

import re
from dataclasses import dataclass
from typing import Optional

from . import llama
from .args import take_alias

RENAMES = [  # checkpoint name pattern -> ours
    (r"^transformer\.wte\.", "model.embed_tokens."),
    (r"^transformer\.h\.", "model.layers."),
    (r"^transformer\.ln_f\.", "model.norm."),
    (r"\.attn\.attention\.", ".self_attn."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.ln_1\.", ".input_layernorm."),
    (r"\.ln_2\.", ".post_attention_layernorm."),
    (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
    (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."),
    (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
]
CONFIG_NAMES = {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
                "activation_function": "hidden_act"}


@dataclass
class ModelArgs(llama.ModelArgs):
    num_hidden_layers: Optional[int] = None  # or the checkpoint's (and mlx-lm's) num_layers
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    tie_word_embeddings: bool = False
    num_layers: Optional[int] = None
    layer_norm_epsilon: Optional[float] = None

    def __post_init__(self):
        self.num_hidden_layers = take_alias(self, "num_hidden_layers", "num_layers")
        if self.layer_norm_epsilon is not None:
            self.rms_norm_eps = self.layer_norm_epsilon
        super().__post_init__()

    @classmethod
    def from_dict(cls, params):
        params = dict(params)
        for theirs, ours in CONFIG_NAMES.items():
            if theirs in params:
                params.setdefault(ours, params.pop(theirs))
        return super().from_dict(params)


class Model(llama.Model):
    def sanitize(self, weights):
        out = {}
        for key, value in weights.items():
            for pattern, repl in RENAMES:
                key = re.sub(pattern, repl, key)
            out[key] = value
        return super().sanitize(out)
