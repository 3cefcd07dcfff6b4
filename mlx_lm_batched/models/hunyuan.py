"""Hunyuan (Hunyuan-A13B's release, ``model_type`` "hunyuan"): the Hunyuan MoE
model of :mod:`.hunyuan_v1_moe` (NTK-alpha RoPE, QK-norm after RoPE, per-layer
``moe_topk``, shared MLP, cross-layer attention) under the original release's
config: one expert means a dense MLP, and the embeddings are tied unless the
config says otherwise. ``sanitize`` also splits the original fused projections:
``qkv_proj`` (rows grouped per key/value head) and ``gate_and_up_proj`` (up first)."""

from dataclasses import dataclass

import mlx.core as mx

from . import hunyuan_v1_moe
from .internlm2 import regroup_wqkv


@dataclass
class ModelArgs(hunyuan_v1_moe.ModelArgs):
    tie_word_embeddings: bool = True

    def is_moe_layer(self, i):
        return self.num_experts > 1


class Model(hunyuan_v1_moe.Model):
    def sanitize(self, weights):
        args = self.args
        nq = args.num_attention_heads * args.head_dim
        nk = args.num_key_value_heads * args.head_dim
        out = {}
        for key, value in weights.items():
            if ".self_attn.qkv_proj." in key:
                value = regroup_wqkv(value, args.num_key_value_heads, args.head_dim)
                for name, part in zip(("q_proj", "k_proj", "v_proj"),
                                      mx.split(value, [nq, nq + nk], axis=0)):
                    out[key.replace("qkv_proj", name)] = part
            elif ".gate_and_up_proj." in key:
                up, gate = mx.split(value, 2, axis=0)
                out[key.replace("gate_and_up_proj", "up_proj")] = up
                out[key.replace("gate_and_up_proj", "gate_proj")] = gate
            else:
                out[key] = value
        return super().sanitize(out)
