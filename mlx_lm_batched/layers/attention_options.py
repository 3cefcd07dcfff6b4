"""The variant switches of the shared :class:`~.attention.Attention`, in three named
parts, each checked once when it is made: how queries and keys are normed
(:class:`QKNorm`), how q, k, v and the output are projected (:class:`Projections`),
and how the attention scores are formed (:class:`Scores`); and the gate of
:class:`~.attention.OutputGatedAttention` (:class:`OutputGate`). A model passes only
the parts it changes; the defaults are plain multi-head attention."""

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class QKNorm:
    """Norms of the queries and keys. ``factory(dims) -> module`` makes each norm;
    ``full``: norm the whole q/k projection, not each head (OLMo 2); ``after_rope``:
    norm the rotated heads (Hunyuan); ``names``: the checkpoint's names of the query
    and key norms."""

    factory: Callable
    full: bool = False
    after_rope: bool = False
    names: tuple = ("q_norm", "k_norm")

    def __post_init__(self):
        if not callable(self.factory):
            raise ValueError(f"QKNorm factory must be callable (dims -> norm), got "
                             f"{self.factory!r}")
        if self.full and self.after_rope:
            raise ValueError("QKNorm: full (whole projection) and after_rope (rotated heads) "
                             "exclude each other")
        if (len(self.names) != 2 or not all(isinstance(n, str) and n for n in self.names)
                or self.names[0] == self.names[1]):
            raise ValueError(f"QKNorm names must be two different names, got {self.names!r}")


@dataclass(frozen=True)
class Projections:
    """The q/k/v and output projections. ``bias``: of q, k, v (and of ``o_proj``
    unless ``o_bias`` says otherwise); ``fused_qkv``: one projection holding q, k then
    v (Phi 3), named ``qkv_name`` (Baichuan's ``W_pack``); ``values_from_keys``: no
    ``v_proj``, the values are the key projection before its norm and RoPE (Gemma 4's
    ``attention_k_eq_v``); ``clip``: clamp q, k, v to ``[-clip, clip]`` (OLMo, DBRX);
    ``v_norm``: a function on the per-head values ``(B, heads, L, head_dim)`` (Gemma
    3n's and 4's RMS norm without weight)."""

    bias: bool = False
    o_bias: Optional[bool] = None
    fused_qkv: bool = False
    qkv_name: str = "qkv_proj"
    values_from_keys: bool = False
    clip: Optional[float] = None
    v_norm: Optional[Callable] = None

    def __post_init__(self):
        if self.fused_qkv and self.values_from_keys:
            raise ValueError("Projections: values_from_keys needs separate q/k projections, "
                             "not fused_qkv")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"Projections clip must be positive, got {self.clip!r}")
        if not (isinstance(self.qkv_name, str) and self.qkv_name):
            raise ValueError(f"Projections qkv_name must be a name, got {self.qkv_name!r}")
        if self.v_norm is not None and not callable(self.v_norm):
            raise ValueError(f"Projections v_norm must be callable, got {self.v_norm!r}")


@dataclass(frozen=True)
class Scores:
    """How the attention scores are formed. ``scale``: of the logits (default
    ``head_dim ** -0.5``); ``softcap``: ``softcap * tanh(logits / softcap)`` (Gemma 2);
    ``sinks``: per-head learned logits of an extra key with no value (GPT-OSS);
    ``position_scale``: ``f(positions (B, L)) -> (B, L)`` factors on the rotated
    queries (Llama 4's and Ministral 3's long-context temperature)."""

    scale: Optional[float] = None
    softcap: Optional[float] = None
    sinks: bool = False
    position_scale: Optional[Callable] = None

    def __post_init__(self):
        if self.position_scale is not None and not callable(self.position_scale):
            raise ValueError(f"Scores position_scale must be callable, got "
                             f"{self.position_scale!r}")


@dataclass(frozen=True)
class OutputGate:
    """The output gate of :class:`~.attention.OutputGatedAttention`: the heads' output
    times ``kind`` (``"sigmoid"``, AFMoE; ``"softplus"``, Laguna) of a projection of
    ``x`` named ``name`` (with a bias when ``bias``); ``per_head``: one gate per head,
    broadcast over its features, instead of one per feature."""

    KINDS = ("sigmoid", "softplus")

    kind: str = "sigmoid"
    per_head: bool = False
    name: str = "gate_proj"
    bias: bool = False

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise ValueError(f"unknown attention output gate '{self.kind}' "
                             f"(known: {self.KINDS})")
        if not (isinstance(self.name, str) and self.name):
            raise ValueError(f"OutputGate name must be a name, got {self.name!r}")
