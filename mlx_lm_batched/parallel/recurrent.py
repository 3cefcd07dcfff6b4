"""Tensor parallelism of the recurrent layers: Mamba and Mamba-2 mixers, gated delta-rule
and Kimi delta attention, lightning attention, LFM2's short convolution, RG-LRU blocks,
and Qwen3-Next's output-gated attention.

``SHARDERS`` maps each of those layer classes (and two hybrid families' own MLP and MoE
blocks, Muse Spark's and Kimi K3's MoE) to its function here; ``shard.shard_model`` looks
every module's class up in it before the shared blocks. The layers know nothing of this
module (parallelism imports the layers, never the reverse). The scheme is the attention
one: a layer's heads (or channels) are split over the ranks, its input projections keep
this rank's output rows (whole heads or groups; the convolution channels follow their
heads), its output projection keeps the matching input columns and sums over the group
(one all-reduce). The recurrence itself runs on this rank's heads only, so each rank's
``StateCache`` holds exactly its heads' state. Norms spanning several heads are split in
whole norm groups, or all-reduce their sum of squares (Mamba-2's gated norm with fewer
groups than ranks, MiniMax's norm over every head). Head counts that do not divide split
unevenly in whole heads; a layer that cannot split exactly raises ``ValueError`` naming
it.
"""

import math

import mlx.core as mx

from ..layers.block_sparse_attention import BlockSparseAttention
from ..layers.conv_attention import ConvKVAttention, ConvKVGatedMixer
from ..layers.gated_delta import GatedDeltaNet, KimiDeltaAttention
from ..layers.lightning import LightningAttention
from ..layers.norms import RMSNorm
from ..layers.ssm import GatedRMSNorm, ShortConv
from ..models.bailing_moe_linear import LinearAttention as BailingLinearAttention
from ..models.falcon_h1 import MLP as FalconH1MLP
from ..models.kimi_k3 import LatentMoE
from ..models.mamba import MambaMixer
from ..models.mamba2 import Mamba2Mixer
from ..models.muse_spark import CompressedMoE
from ..models.nemotron_h import NemotronMoE
from ..models.plamo2 import PlamoAttention
from ..models.prism_hadamard_qwen35 import Model as HadamardPackModel
from ..models.qwen3_next import GatedAttention
from ..models.recurrent_gemma import RecurrentBlock
from .sharded_layers import ShardedRMSNorm, _sum
from .tensor import (
    _quant_unit,
    _shard_mlp,
    _slice_in,
    _slice_out,
    head_ranges,
    shard_shared_block,
    split_range,
)


class ShardedGatedRMSNorm(GatedRMSNorm):
    """:class:`GatedRMSNorm` of one norm group (``index`` of ``n_groups``, each ``width``
    channels) whose channels are split over ``group``: the per-group sum of squares is
    all-reduced (a ``(..., n_groups)`` vector), the weight is this rank's slice."""

    group = None
    index = n_groups = width = None

    def _normalize(self, x):
        ss = mx.sum(x * x, axis=-1, keepdims=True)
        onehot = (mx.arange(self.n_groups) == self.index).astype(mx.float32)
        ss = _sum(ss * onehot, self.group)[..., self.index:self.index + 1]
        return x * mx.rsqrt(ss / self.width + self.eps)


def _take(x, ranges, axis=0):
    """The ``[a, b)`` ranges of ``x`` along ``axis``, concatenated."""
    lead = (slice(None),) * axis
    return mx.concatenate([x[lead + (slice(a, b),)] for a, b in ranges], axis=axis)


def _slice_conv(conv, ranges):
    """Keep the channels ``ranges`` of a depthwise ``CausalConv1d``."""
    for name in ("weight", "bias"):
        if name in conv:
            conv[name] = _take(conv[name], ranges)


def _ranks(group):
    return group.size(), group.rank()


def _heads(n, group, path):
    """This rank's ``[a, b)`` of ``n`` heads (uneven when they do not divide)."""
    size, rank = _ranks(group)
    if n < size:
        raise ValueError(f"cannot shard '{path}': {n} heads over {size} ranks")
    return split_range(n, size, rank)


def _channels(n, unit, group, path):
    """This rank's ``[a, b)`` of ``n`` channels, in blocks of ``unit`` (a quantization
    group); refused on every rank alike when some rank would get none."""
    size, rank = _ranks(group)
    if n // unit < size:
        raise ValueError(f"cannot shard '{path}': {n} channels over {size} ranks in "
                         f"blocks of {unit}")
    return split_range(n, size, rank, unit)


def _grouped(n_heads, n_groups, group, path, what):
    """``head_ranges`` (whole groups, or a replicated group whose heads are split) with
    the layer named in its error."""
    try:
        return head_ranges(n_heads, n_groups, *_ranks(group))
    except ValueError:
        raise ValueError(f"cannot shard '{path}': {what} over {group.size()} ranks") from None


def shard_mamba2(m, group, path):
    """Mamba-2's SSD mixer: whole B/C groups and their heads (a group is replicated and
    its heads split when there are fewer groups than ranks, as GQA's KV heads)."""
    D, N, G, H, P = m.sizes
    (ha, hb), (ga, gb) = _grouped(H, G, group, path, f"{H} heads in {G} groups")
    GN = G * N
    x, bc = (ha * P, hb * P), (ga * N, gb * N)
    rows = [x, (D + x[0], D + x[1]), (2 * D + bc[0], 2 * D + bc[1]),
            (2 * D + GN + bc[0], 2 * D + GN + bc[1]), (2 * D + 2 * GN + ha, 2 * D + 2 * GN + hb)]
    _slice_out(m.in_proj, rows)
    if m._in_scale is not None:
        m._in_scale = _take(m._in_scale, rows)
    _slice_conv(m.conv1d, [x, (D + bc[0], D + bc[1]), (D + GN + bc[0], D + GN + bc[1])])
    for name in ("dt_bias", "A_log", "D"):
        m[name] = m[name][ha:hb]
    if "norm" in m:
        norm = m.norm
        norm.weight = norm.weight[x[0]:x[1]]
        if G < group.size():  # this rank holds part of one norm group: sum over ranks
            norm.__class__ = ShardedGatedRMSNorm
            norm.group, norm.index, norm.n_groups, norm.width = group, ga, G, D // G
            norm.groups = 1
        else:
            norm.groups = gb - ga
    _slice_in(m.out_proj, x[0], x[1], group, f"{path}.out_proj")
    m.sizes = ((hb - ha) * P, N, gb - ga, hb - ha, P)


def shard_mamba(m, group, path):
    """Mamba's selective-SSM mixer, by channels: ``x_proj`` (channels to dt, B, C) and
    ``out_proj`` sum over the group; ``dt_proj`` keeps this rank's channels."""
    D, N, R = m.sizes
    unit = math.lcm(_quant_unit(m.x_proj), _quant_unit(m.out_proj))
    a, b = _channels(D, unit, group, path)
    _slice_out(m.in_proj, [(a, b), (D + a, D + b)])
    _slice_conv(m.conv1d, [(a, b)])
    _slice_in(m.x_proj, a, b, group, f"{path}.x_proj")
    _slice_out(m.dt_proj, [(a, b)])
    m.A_log, m.D = m.A_log[a:b], m.D[a:b]
    _slice_in(m.out_proj, a, b, group, f"{path}.out_proj")
    m.sizes = (b - a, N, R)


def shard_gated_delta(m, group, path):
    """Qwen3-Next's / Qwen3.5's gated delta net: whole key heads with their value heads
    (a key head replicated and its value heads split when there are fewer than ranks)."""
    Hk, Hv, Dk, Dv = m.sizes
    (va, vb), (ka, kb) = _grouped(Hv, Hk, group, path, f"{Hv} value heads, {Hk} key heads")
    r, Kd = Hv // Hk, Hk * Dk
    if m.fused:  # per key head: [q, k, its r value heads, their r gates] and [b (r), a (r)]
        W, qkvz, ba = 2 * Dk + 2 * r * Dv, [], []
        for h in range(ka, kb):
            j0, j1 = max(va - h * r, 0), min(vb - h * r, r)
            base = h * W
            qkvz += [(base, base + 2 * Dk), (base + 2 * Dk + j0 * Dv, base + 2 * Dk + j1 * Dv),
                     (base + 2 * Dk + (r + j0) * Dv, base + 2 * Dk + (r + j1) * Dv)]
            ba += [(h * 2 * r + j0, h * 2 * r + j1), (h * 2 * r + r + j0, h * 2 * r + r + j1)]
        _slice_out(m.in_proj_qkvz, qkvz)
        _slice_out(m.in_proj_ba, ba)
    else:
        _slice_out(m.in_proj_qkv, [(ka * Dk, kb * Dk), (Kd + ka * Dk, Kd + kb * Dk),
                                   (2 * Kd + va * Dv, 2 * Kd + vb * Dv)])
        _slice_out(m.in_proj_z, [(va * Dv, vb * Dv)])
        _slice_out(m.in_proj_b, [(va, vb)])
        _slice_out(m.in_proj_a, [(va, vb)])
    _slice_conv(m.conv1d, [(ka * Dk, kb * Dk), (Kd + ka * Dk, Kd + kb * Dk),
                           (2 * Kd + va * Dv, 2 * Kd + vb * Dv)])
    m.dt_bias, m.A_log = m.dt_bias[va:vb], m.A_log[va:vb]
    _slice_in(m.out_proj, va * Dv, vb * Dv, group, f"{path}.out_proj")  # norm: per head
    m.sizes = (kb - ka, vb - va, Dk, Dv)


def shard_kimi_delta(m, group, path):
    """Kimi delta attention by heads; the low-rank ``f_a_proj``/``g_a_proj`` stay whole."""
    H, Dk = m.sizes
    a, b = _heads(H, group, path)
    dim, cols = H * Dk, (a * Dk, b * Dk)
    gate = m.g_proj if "g_proj" in m else m.g_b_proj  # full-rank or low-rank output gate
    for proj in (m.q_proj, m.k_proj, m.v_proj, m.forget_gate.f_b_proj, gate):
        _slice_out(proj, [cols])
    _slice_out(m.b_proj, [(a, b)])
    _slice_conv(m.conv1d, [cols, (dim + cols[0], dim + cols[1]),
                           (2 * dim + cols[0], 2 * dim + cols[1])])
    fg = m.forget_gate
    fg.dt_bias, fg.A_log = fg.dt_bias[cols[0]:cols[1]], fg.A_log[:, :, a:b]
    _slice_in(m.o_proj, cols[0], cols[1], group, f"{path}.o_proj")  # o_norm: per head
    m.sizes = (b - a, Dk)


def shard_lightning(m, group, path):
    """MiniMax's lightning attention by heads; its RMS norm over every head all-reduces
    the sum of squares (``ShardedRMSNorm``)."""
    D = m.head_dim
    a, b = _heads(m.n_heads, group, path)
    _slice_out(m.qkv_proj, [(3 * a * D, 3 * b * D)])  # per head: q, k, v
    _slice_out(m.output_gate, [(a * D, b * D)])
    if type(m.norm) is not RMSNorm:
        raise ValueError(f"cannot shard '{path}.norm' ({type(m.norm).__name__}): a norm "
                         "over every head of an unknown kind")
    full = m.norm.weight.shape[0]
    m.norm.weight = m.norm.weight[a * D:b * D]
    m.norm.__class__ = ShardedRMSNorm
    m.norm.group, m.norm.full_dims = group, full
    m._slope = m._slope[a:b]  # each head keeps its own decay
    _slice_in(m.out_proj, a * D, b * D, group, f"{path}.out_proj")
    m.n_heads = b - a


def shard_short_conv(m, group, path):
    """LFM2's gated short convolution by channels (``in_proj``: B, C, x per channel)."""
    C = m.conv.weight.shape[0]
    a, b = _channels(C, _quant_unit(m.out_proj), group, path)
    _slice_out(m.in_proj, [(a, b), (C + a, C + b), (2 * C + a, 2 * C + b)])
    _slice_conv(m.conv, [(a, b)])
    _slice_in(m.out_proj, a, b, group, f"{path}.out_proj")


def shard_rg_lru_block(m, group, path):
    """RecurrentGemma's recurrent block by RG-LRU heads (block-diagonal gates)."""
    lru = m.rg_lru
    W = lru.recurrent_param.shape[0]
    a, b = _heads(lru.heads, group, path)
    bw = W // lru.heads
    cols = [(a * bw, b * bw)]
    _slice_out(m.linear_y, cols)
    _slice_out(m.linear_x, cols)
    _slice_conv(m.conv_1d, cols)
    lru.recurrent_param = lru.recurrent_param[a * bw:b * bw]
    for name in ("input_gate_weight", "input_gate_bias", "recurrent_gate_weight",
                 "recurrent_gate_bias"):
        lru[name] = lru[name][a:b]
    lru.heads = b - a
    _slice_in(m.linear_out, a * bw, b * bw, group, f"{path}.linear_out")


def shard_gated_attention(attn, group, path):
    """Qwen3-Next's output-gated attention: ``q_proj`` holds each head's query then its
    gate; otherwise the shared attention's split (whole KV groups, per-head norms)."""
    (qa, qb), (ka, kb) = _grouped(attn.n_heads, attn.n_kv_heads, group, path,
                                  f"{attn.n_heads} heads, {attn.n_kv_heads} KV heads")
    hd = attn.head_dim
    if attn.qk_norm_full or "sinks" in attn or attn.fused_qkv:
        raise ValueError(f"cannot shard '{path}': gated attention with whole-projection "
                         "norms, sinks or a fused qkv_proj")
    _slice_out(attn.q_proj, [(2 * qa * hd, 2 * qb * hd)])
    _slice_out(attn.k_proj, [(ka * hd, kb * hd)])
    _slice_out(attn.v_proj, [(ka * hd, kb * hd)])
    _slice_in(attn.o_proj, qa * hd, qb * hd, group, f"{path}.o_proj")
    attn.n_heads, attn.n_kv_heads = qb - qa, kb - ka


def shard_bailing_linear(attn, group, path):
    """Bailing Linear's lightning attention: the shared attention's split by heads (each
    its own key/value head), plus the output gate's rows, each head's decay and the
    grouped output norm (whole norm groups, or one group's part with its sum of squares
    all-reduced)."""
    a, b = _heads(attn.n_heads, group, path)
    shard_shared_block(attn, group, path)  # q, k, v heads, o_proj, QK-norms
    hd = attn.head_dim
    cols = (a * hd, b * hd)
    _slice_out(attn.g_proj, [cols])
    attn._slope = attn._slope[a:b]
    norm = attn.g_norm
    width = norm.weight.shape[0] // norm.groups
    norm.weight = norm.weight[cols[0]:cols[1]]
    if cols[0] % width == 0 and cols[1] % width == 0:  # whole norm groups
        norm.groups = (cols[1] - cols[0]) // width
    elif cols[0] // width == (cols[1] - 1) // width:  # part of one norm group
        n_groups = norm.groups
        norm.__class__ = ShardedGatedRMSNorm
        norm.group, norm.index, norm.n_groups, norm.width = group, cols[0] // width, n_groups, width
        norm.groups = 1
    else:
        raise ValueError(f"cannot shard '{path}.g_norm': {attn.n_heads} heads in "
                         f"{norm.groups} norm groups over {group.size()} ranks")


def shard_plamo_attention(attn, group, path):
    """PLaMo 2's attention: the shared split, and each kept head's QK-norm weight row."""
    (qa, qb), (ka, kb) = _grouped(attn.n_heads, attn.n_kv_heads, group, path,
                                  f"{attn.n_heads} heads, {attn.n_kv_heads} KV heads")
    q_weight, k_weight = attn.q_weight, attn.k_weight
    shard_shared_block(attn, group, path)
    attn.q_weight, attn.k_weight = q_weight[qa:qb], k_weight[ka:kb]


def refuse_hadamard_pack(model, group, path):
    """PrismML's Hadamard packs: their rotated 2-bit layers have no sharder."""
    raise ValueError(f"cannot shard '{type(model).__module__.rsplit('.', 1)[-1]}': "
                     "Hadamard-rotated 2-bit layers (a Hadamard pack) have no sharder")


def shard_falcon_h1_mlp(m, group, path):
    """Falcon-H1's MLP (multipliers on the gate and the output) by hidden units, as the
    shared MLP."""
    _shard_mlp([(m.gate_proj, 1), (m.up_proj, 1)], m.down_proj, group, path)


def shard_nemotron_moe(m, group, path):
    """Nemotron-H's MoE: the experts and the shared MLP split their hidden units; the
    router and the latent projections stay whole (the experts' output is summed over the
    ranks before ``fc2_latent_proj``)."""
    shard_shared_block(m.switch_mlp, group, f"{path}.switch_mlp")
    shard_shared_block(m.shared_experts, group, f"{path}.shared_experts")


def shard_compressed_moe(m, group, path):
    """Muse Spark's MoE: the experts split their hidden units (each expert's output is
    summed over the ranks before its own norm); the router and the compressing
    projections around the experts stay whole."""
    shard_shared_block(m.experts, group, f"{path}.experts")


def shard_latent_moe(m, group, path):
    """Kimi K3's MoE: the experts and the shared MLP split their hidden units (the
    experts' outputs are summed over the ranks before the latent norm); the router and
    the latent projections stay whole."""
    shard_shared_block(m.switch_mlp, group, f"{path}.switch_mlp")
    if "shared_experts" in m:
        shard_shared_block(m.shared_experts, group, f"{path}.shared_experts")


def shard_conv_kv_attention(m, group, path):
    """Baichuan-M1's attention: the shared attention's head split, and each rank keeps
    its key/value heads' convolution taps."""
    _, (ka, kb) = head_ranges(m.n_heads, m.n_kv_heads, group.size(), group.rank())
    shard_shared_block(m, group, path)
    m.conv_k, m.conv_v = m.conv_k[:, :, ka:kb], m.conv_v[:, :, ka:kb]


def shard_conv_kv_gated_mixer(m, group, path):
    """Gear's local mixer: the shared attention's head split, and each rank keeps its
    key/value heads' convolution channels (the gate and product are per feature)."""
    _, (ka, kb) = head_ranges(m.n_heads, m.n_kv_heads, group.size(), group.rank())
    shard_shared_block(m, group, path)
    for conv in (m.key_conv, m.value_conv):
        _slice_conv(conv, [(ka * m.head_dim, kb * m.head_dim)])


def shard_block_sparse_attention(m, group, path):
    """MiniMax M3's block-sparse attention: the shared attention's head split; each
    rank keeps the indexer query heads of its query heads' groups (the one indexer key
    head stays whole). Refused when a rank's query heads split an indexer group."""
    ix = m.indexer
    (qa, qb), _ = head_ranges(m.n_heads, m.n_kv_heads, group.size(), group.rank())
    per = m.n_heads // ix.heads
    if qa % per or qb % per:
        raise ValueError(f"cannot shard '{path}': this rank's query heads {qa}..{qb} split "
                         f"an indexer head's group of {per}")
    shard_shared_block(m, group, path)
    _slice_out(ix.q_proj, [(qa // per * ix.head_dim, qb // per * ix.head_dim)])
    ix.heads = (qb - qa) // per


SHARDERS = {
    ConvKVAttention: shard_conv_kv_attention,
    ConvKVGatedMixer: shard_conv_kv_gated_mixer,
    BlockSparseAttention: shard_block_sparse_attention,
    MambaMixer: shard_mamba,
    Mamba2Mixer: shard_mamba2,
    GatedDeltaNet: shard_gated_delta,
    KimiDeltaAttention: shard_kimi_delta,
    LightningAttention: shard_lightning,
    ShortConv: shard_short_conv,
    RecurrentBlock: shard_rg_lru_block,
    GatedAttention: shard_gated_attention,
    BailingLinearAttention: shard_bailing_linear,
    PlamoAttention: shard_plamo_attention,
    HadamardPackModel: refuse_hadamard_pack,
    FalconH1MLP: shard_falcon_h1_mlp,
    NemotronMoE: shard_nemotron_moe,
    CompressedMoE: shard_compressed_moe,
    LatentMoE: shard_latent_moe,
}
