"""PrismML's Hadamard packs of Qwen3.5 (``prism_hadamard_qwen35``): a Qwen3.5 language
model, converted by mlx-lm, whose listed modules (``modules``: path, embedding or not,
Hadamard block) are 2-bit affine layers with a Hadamard rotation folded into their input
axis (``layers/hadamard.py``); every other layer loads as the config's ``quantization``
and the weights say. Schema 1 packs are keyed like mlx-lm's text model, schema 2 like
mlx-vlm's (``language_model.`` prefix, vision tower dropped: image input is not
supported)."""

from dataclasses import dataclass, field
from typing import Any, Dict, List

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ..layers.hadamard import BITS, GROUP_SIZE, HadamardQuantizedEmbedding, HadamardQuantizedLinear
from . import qwen3_5
from .multimodal import accepts_text_config

NAMESPACES = {1: "mlx-lm-text", 2: "mlx-vlm-qwen3_5"}
PACK_QUANTIZATION = {"bits": BITS, "group_size": GROUP_SIZE, "mode": "affine"}


@accepts_text_config
@dataclass
class ModelArgs(qwen3_5.ModelArgs):
    schema_version: int = 2
    tensor_namespace: str = ""
    gdn_activation_layout: str = "grouped"
    quantization: Dict[str, Any] = field(default_factory=dict)
    modules: List[Dict[str, Any]] = field(default_factory=list)

    def __post_init__(self):
        super().__post_init__()
        if NAMESPACES.get(self.schema_version) != self.tensor_namespace:
            raise ValueError(f"unsupported Hadamard pack: schema {self.schema_version}, "
                             f"namespace {self.tensor_namespace!r}")
        if self.gdn_activation_layout != "grouped":
            raise ValueError("Hadamard packs need gdn_activation_layout 'grouped', got "
                             f"{self.gdn_activation_layout!r}")
        global_q = {k: self.quantization.get(k) for k in PACK_QUANTIZATION}
        if global_q != PACK_QUANTIZATION:
            raise ValueError(f"Hadamard packs need 2-bit affine weights in groups of 128, "
                             f"got {global_q}")
        if not self.modules:
            raise ValueError("Hadamard pack without its 'modules' manifest")


class Model(qwen3_5.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        modules = dict(self.named_modules())
        packed, seen = [], set()
        for record in args.modules:
            path = record["path"]
            if path in seen:
                raise ValueError(f"packed module listed twice: {path}")
            seen.add(path)
            original = modules.get(path)
            if not isinstance(original, (nn.Linear, nn.Embedding)):
                raise ValueError(f"packed module {path} is not a linear layer or an embedding here")
            if record["embedding"] != isinstance(original, nn.Embedding):
                raise ValueError(f"packed module {path}: 'embedding' does not match its kind")
            if record["dtype"] != "float16":
                raise ValueError(f"packed module {path}: activations {record['dtype']!r}, "
                                 "only float16 is supported")
            if "bias" in original:
                raise ValueError(f"packed module {path} has a bias: not supported")
            cls = HadamardQuantizedEmbedding if record["embedding"] else HadamardQuantizedLinear
            rows, width = original.weight.shape
            packed.append((path, cls(width, rows, record["block"])))
        self.update_modules(tree_unflatten(packed))

    def sanitize(self, weights):
        # Schema 2 (mlx-vlm's keys): the language model under ``language_model.``.
        weights = {k[len("language_model."):] if k.startswith("language_model.") else k: v
                   for k, v in weights.items() if not k.startswith(("vision_tower.", "visual."))}
        weights = super().sanitize(weights)
        bad = []
        for record in self.args.modules:
            if record["block"]:
                key = f"{record['path']}.signs"
                if key not in weights:
                    raise ValueError(f"missing Hadamard sign vector {key}")
                bad.append(mx.any((weights[key] != 1) & (weights[key] != -1)))
        if bad and mx.any(mx.stack(bad)).item():
            raise ValueError("Hadamard signs must be -1 or +1")
        return weights
