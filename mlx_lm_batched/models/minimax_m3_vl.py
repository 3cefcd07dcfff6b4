"""MiniMax M3 (``minimax_m3_vl``): the language model of the vision-language
checkpoint. Gemma-style norms (``1 + w``) everywhere, per-head QK-norm, partial RoPE,
block-sparse attention on the layers ``layer_types`` (or ``sparse_attention_freq``)
marks (:mod:`..layers.block_sparse_attention`), and per layer a dense MLP or a
sigmoid-routed MoE (choice shifted by ``e_score_correction_bias``, weights
renormalised and scaled by ``routed_scaling_factor``) plus a shared expert, all with
the clamped SwiGLU ``(clip(up) + 1) * g * sigmoid(alpha * g)``, ``g = min(gate, limit)``.

Image input is not supported: the vision tower and projector are dropped and these
checkpoints generate from text only. Reads the hub's names (``block_sparse_moe.experts.{e}.w1``,
``self_attn.index_*``), transformers 5's in-memory ones (fused ``gate_up_proj``,
``self_attn.indexer.*``) and mlx-lm's (stacked ``switch_mlp``)."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx

from ..layers.attention import Attention
from ..layers.attention_options import QKNorm
from ..layers.block_sparse_attention import BlockIndexer, BlockSparseAttention
from ..layers.blocks import PreNormBlock
from ..layers.mlp import MLP
from ..layers.moe import SparseMoE, SwitchGLU, combine_experts, softmax_topk, stack_experts
from ..layers.norms import RMSNorm
from ..layers.rope import make_rope
from ..layers.stack import CausalLM
from .common import DecoderArgs, init_causal_lm
from .gpt_oss import ClampedSwiGLU
from .mixtral import MIXTRAL_EXPERT_NAMES
from .multimodal import TextConfigArgs, accepts_text_config, check_text_model_type, language_model_weights

TEXT_MODEL_TYPES = ("minimax_m3_vl_text",)
SPARSE_CONFIG_KEYS = {"sparse_num_index_heads": "index_n_heads",
                      "sparse_index_dim": "index_head_dim",
                      "sparse_block_size": "index_block_size",
                      "sparse_topk_blocks": "index_topk_blocks",
                      "sparse_local_block": "index_local_blocks",
                      "sparse_attention_freq": "sparse_attention_freq"}


@accepts_text_config
@dataclass
class ModelArgs(TextConfigArgs, DecoderArgs):
    vocab_size: int = 200064
    dense_intermediate_size: int = 12288
    shared_intermediate_size: int = 3072
    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 5_000_000.0
    rotary_dim: Optional[int] = None
    partial_rotary_factor: float = 0.5
    routed_scaling_factor: float = 2.0
    use_qk_norm: bool = True
    use_gemma_norm: bool = True
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    mlp_layer_types: Optional[List[str]] = None
    moe_layer_freq: Optional[List[int]] = None
    layer_types: Optional[List[str]] = None
    sparse_attention_config: Optional[dict] = None
    sparse_attention_freq: Optional[List[int]] = None
    index_n_heads: Optional[int] = None
    index_head_dim: Optional[int] = None
    index_block_size: Optional[int] = None
    index_topk_blocks: Optional[int] = None
    index_local_blocks: int = 1
    text_model_type: Optional[str] = None

    def __post_init__(self):
        super().__post_init__()
        check_text_model_type(self, TEXT_MODEL_TYPES)
        # The published config nests the indexer's settings; a transformers 5 save
        # spells them flat.
        for nested, flat in SPARSE_CONFIG_KEYS.items():
            if nested in (self.sparse_attention_config or {}):
                setattr(self, flat, self.sparse_attention_config[nested])
        if self.rotary_dim is None:
            self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)

    def is_moe(self, i):
        """Layer ``i`` has the MoE (``mlp_layer_types``, else ``moe_layer_freq``)."""
        if self.mlp_layer_types is not None:
            return self.mlp_layer_types[i] == "sparse"
        return self.moe_layer_freq is None or bool(self.moe_layer_freq[i])

    def is_sparse(self, i):
        """Layer ``i`` has block-sparse attention (``layer_types``, else
        ``sparse_attention_freq``; none without an indexer block size)."""
        if self.index_block_size is None:
            return False
        if self.layer_types is not None:
            return self.layer_types[i] != "full_attention"
        return self.sparse_attention_freq is None or bool(self.sparse_attention_freq[i])


class ClampedGLUMLP(MLP):
    """The gated MLP with MiniMax's clamped SwiGLU (dense layers, shared expert)."""

    def __init__(self, hidden_size, intermediate_size, glu):
        super().__init__(hidden_size, intermediate_size)
        self.glu = glu

    def __call__(self, x):
        return self.down_proj(self.glu(self.gate_proj(x), self.up_proj(x)))


class ScaledSigmoidMoE(SparseMoE):
    """Sigmoid router (choice shifted by ``e_score_correction_bias``), renormalised
    weights times ``scale``, plus the unscaled ``shared_experts``."""

    def __init__(self, args: ModelArgs, glu):
        super().__init__(args.hidden_size, args.intermediate_size, args.num_local_experts,
                         args.num_experts_per_tok, normalize=True,
                         switch=SwitchGLU(args.hidden_size, args.intermediate_size,
                                          args.num_local_experts, glu=glu))
        self.e_score_correction_bias = mx.zeros((args.num_local_experts,))
        self.shared_experts = ClampedGLUMLP(args.hidden_size, args.shared_intermediate_size, glu)
        self.scale = args.routed_scaling_factor

    def __call__(self, x):
        indices, weights = softmax_topk(self.gate(x), self.top_k, normalize=True, sigmoid=True,
                                        choice_bias=self.e_score_correction_bias)
        y = combine_experts(self.switch_mlp(x, indices), weights * self.scale, x.dtype)
        return y + self.shared_experts(x)


class Model(CausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__()
        norm = lambda dims=args.hidden_size: RMSNorm(dims, args.rms_norm_eps,
                                                     zero_centered=args.use_gemma_norm)
        rope = make_rope(args.rotary_dim, args.rope_theta, False, args.rope_scaling,
                         args.max_position_embeddings)
        glu = ClampedSwiGLU(args.swiglu_alpha, args.swiglu_limit)
        layers = []
        for i in range(args.num_hidden_layers):
            kwargs = dict(qk_norm=QKNorm(norm) if args.use_qk_norm else None)
            dims = (args.hidden_size, args.num_attention_heads, args.num_key_value_heads,
                    args.head_dim, rope)
            if args.is_sparse(i):
                # The reference truncates the RoPE to the indexer's head.
                index_rope = make_rope(min(args.rotary_dim, args.index_head_dim), args.rope_theta,
                                       False, args.rope_scaling, args.max_position_embeddings)
                indexer = BlockIndexer(args.hidden_size, args.index_n_heads, args.index_head_dim,
                                       index_rope, norm, args.index_block_size,
                                       args.index_topk_blocks, args.index_local_blocks)
                attn = BlockSparseAttention(*dims, indexer=indexer, **kwargs)
            else:
                attn = Attention(*dims, **kwargs)
            mlp = (ScaledSigmoidMoE(args, glu) if args.is_moe(i)
                   else ClampedGLUMLP(args.hidden_size, args.dense_intermediate_size, glu))
            layers.append(PreNormBlock(attn, mlp, norm))
        init_causal_lm(self, args, layers, norm())

    def make_cache(self, max_kv_size=None):
        """Full key/value caches: the indexer counts blocks over every key a row holds."""
        if max_kv_size is not None:
            raise ValueError("minimax_m3_vl: block-sparse attention needs every key of a row; "
                             "max_kv_size (a rotating cache) is not supported")
        return super().make_cache()

    def sanitize(self, weights):
        out = {}
        for name, w in super().sanitize(language_model_weights(weights)).items():
            name = name.replace(".block_sparse_moe.", ".mlp.")
            name = name.replace(".mlp.gate.e_score_correction_bias", ".mlp.e_score_correction_bias")
            for part in ("q_proj", "k_proj", "q_norm", "k_norm"):
                name = name.replace(f".self_attn.index_{part}.", f".self_attn.indexer.{part}.")
            if name.endswith("gate_up_proj.weight"):  # dense MLP, shared expert: gate first
                gate, up = mx.split(w, 2, axis=0)
                out[name.replace("gate_up_proj", "gate_proj")] = gate
                out[name.replace("gate_up_proj", "up_proj")] = up
                continue
            out[name] = w
        for i in range(self.args.num_hidden_layers):  # hub (w1/w3/w2) or fused experts
            stack_experts(out, f"model.layers.{i}.mlp", self.args.num_local_experts,
                          MIXTRAL_EXPERT_NAMES)
        return out
