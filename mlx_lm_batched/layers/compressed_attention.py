"""DeepSeek V4.1's attention: a sliding window of full-resolution keys plus keys
compressed ``ratio`` tokens to one (a softmax-gated pool of each closed group), of
which an indexer picks each query's top ``index_topk``; keys and values are one
latent per position (MQA with a single shared head), with attention sinks.

Groups close at absolute positions of the row, so rows of a batch close them at
different columns: these modules run one row at a time (batch 1) on that row's real
columns, with the row's state in a dict (``window``, ``pending_kv``,
``pending_gate``, ``compress_kv``, ``index_k``; see ``models/deepseek_v41.py``).
Layers share compressed keys and index choices through ``shared`` (per row, per call).
"""

import mlx.core as mx
import mlx.nn as nn

from .fake_quant import fp4_round_trip, fp8_round_trip
from .moe import SwitchLinear


def _append(old, new):
    return new if old is None or old.shape[1] == 0 else mx.concatenate([old, new], axis=1)


class TailRope:
    """Interleaved RoPE on the last ``dims`` features (float32), with a position scale
    (compressed groups: ``ratio`` positions per step) and its inverse (outputs)."""

    def __init__(self, dims, wavelengths):
        self.dims = dims
        self.wavelengths = wavelengths

    def __call__(self, x, offset, scale=1.0, inverse=False):
        if self.dims == 0:
            return x
        tail = x[..., -self.dims:].astype(mx.float32)
        if x.ndim == 4:  # (B, L, H, D): positions along L
            tail = tail.transpose(0, 2, 1, 3)
        freqs = -self.wavelengths if inverse else self.wavelengths
        tail = mx.fast.rope(tail, self.dims, traditional=True, base=None, scale=scale,
                            offset=offset, freqs=freqs)
        if x.ndim == 4:
            tail = tail.transpose(0, 2, 1, 3)
        return mx.concatenate([x[..., :-self.dims], tail.astype(x.dtype)], axis=-1)


class Compressor(nn.Module):
    """Pools each closed group of ``ratio`` tokens into one normalised latent."""

    def __init__(self, hidden_size, head_dim, ratio, eps):
        super().__init__()
        self.ratio = ratio
        self.kv_proj = nn.Linear(hidden_size, head_dim, bias=False)
        if ratio > 1:
            self.gate_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(head_dim, eps=eps)

    def __call__(self, x, start, state):
        """Latents of the groups this chunk closes (or None) and the group index of
        the first; the open group's rows stay in ``state``."""
        if self.ratio == 1:
            return self.kv_norm(self.kv_proj(x)), start
        h = x.astype(mx.float32)
        pending = state["pending_kv"]
        open_rows = 0 if pending is None else pending.shape[1]
        kv = _append(pending, self.kv_proj(h))
        gate = _append(state["pending_gate"], self.gate_proj(h))
        closed = kv.shape[1] - kv.shape[1] % self.ratio
        state["pending_kv"], state["pending_gate"] = kv[:, closed:], gate[:, closed:]
        first = (start - open_rows) // self.ratio
        if closed == 0:
            return None, first
        shape = (kv.shape[0], -1, self.ratio, kv.shape[-1])
        kv, gate = kv[:, :closed].reshape(shape), gate[:, :closed].reshape(shape)
        latent = mx.sum(kv * mx.softmax(gate, axis=2), axis=2)
        return self.kv_norm(latent.astype(x.dtype)), first


class Indexer(nn.Module):
    """Scores the compressed keys for each query and keeps the top ``topk`` visible
    ones; one layer (the candidate source) also narrows later layers to its best
    blocks of keys."""

    def __init__(self, args, ratio, makes_keys, candidate_source):
        super().__init__()
        self.ratio = ratio
        self.num_heads, self.head_dim = args.index_n_heads, args.index_head_dim
        self.topk = args.index_topk
        self.candidate_source = candidate_source
        self.blocks, self.block = args.candidate_topk_blocks, args.candidate_block_size
        self.q_b_proj = nn.Linear(args.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.weights_proj = nn.Linear(args.hidden_size, self.num_heads, bias=False)
        if makes_keys:
            self.k_proj = nn.Linear(args.head_dim, self.head_dim, bias=False)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=args.rms_norm_eps)

    def __call__(self, x, q_latent, keys, candidates, rope, start):
        """``(top-k indices (1, L, k), -1 for none; the candidate mask)``."""
        _, length, _ = x.shape
        if keys is None or keys.shape[1] == 0:
            return mx.zeros((1, length, 0), dtype=mx.int32), candidates
        q = self.q_b_proj(q_latent).reshape(1, length, self.num_heads, self.head_dim)
        q = fp4_round_trip(rope(q, start), 32)
        w = self.weights_proj(x).astype(mx.float32) * self.num_heads ** -0.5
        scores = q.astype(mx.float32) @ keys.astype(mx.float32)[:, None].swapaxes(-1, -2)
        scores = mx.sum(mx.maximum(scores, 0.0) * self.head_dim ** -0.5 * w[..., None], axis=2)
        # A query sees the groups that close at or before it.
        seen = ((start + 1 + mx.arange(length)) // self.ratio)[:, None]
        scores = mx.where(mx.arange(keys.shape[1])[None] < seen, scores, -mx.inf)
        if self.candidate_source and self.blocks > 0:
            candidates = self._candidates(scores, seen)
        elif candidates is not None:
            scores = mx.where(candidates, scores, -mx.inf)
        k = min(self.topk, keys.shape[1])
        top = mx.argpartition(-scores, k - 1, axis=-1)[..., :k].astype(mx.int32)
        return mx.where(top < seen[None], top, -1), candidates

    def _candidates(self, scores, seen):
        """The keys of each query's ``blocks`` best blocks (its newest block always)."""
        n = scores.shape[-1]
        padded = mx.pad(scores, [(0, 0), (0, 0), (0, (-n) % self.block)],
                        constant_values=-mx.inf)
        best = padded.reshape(*scores.shape[:2], -1, self.block).max(axis=-1)
        newest = mx.where(seen > 0, (seen - 1) // self.block, -1)
        best = mx.where(mx.arange(best.shape[-1]) == newest, mx.inf, best)
        k = min(self.blocks, best.shape[-1])
        chosen = mx.argpartition(-best, k - 1, axis=-1)[..., :k]
        reachable = mx.take_along_axis(best, chosen, axis=-1) > -mx.inf
        mask = mx.put_along_axis(mx.zeros(best.shape, dtype=mx.bool_), chosen, reachable, -1)
        return mx.repeat(mask, self.block, axis=-1)[..., :n]


def window_indices(previous, length, window):
    """The window rows (previous rows, then the new ones) each query sees; -1: none."""
    width = min(window, previous + length)
    end = previous + mx.arange(length)
    idx = mx.maximum(end - window + 1, 0)[:, None] + mx.arange(width)[None]
    return mx.where(idx > end[:, None], -1, idx)


def _gather(values, idx):
    """``values[0, idx]`` for ``idx`` ``(1, L, k)`` (a -1 picks row 0, masked later)."""
    return values[0][mx.maximum(idx[0], 0)][None]


def sparse_attention(q, kvs, indices, sinks, scale):
    """Each query ``(1, L, H, D)`` attends to the rows its indices pick from each
    latent array (keys equal values), with per-head sinks, in float32."""
    _, length, heads, dim = q.shape
    keys = mx.concatenate([_gather(kv, i) for kv, i in zip(kvs, indices)], axis=2)
    keys = keys.reshape(length, 1, -1, dim).astype(mx.float32)
    mask = (mx.concatenate(indices, axis=-1) >= 0).reshape(length, 1, 1, -1)
    out = mx.fast.scaled_dot_product_attention(
        q.reshape(length, heads, 1, dim).astype(mx.float32), keys, keys, scale=scale,
        mask=mask, sinks=sinks.astype(mx.float32))
    return out.reshape(1, length, heads, dim).astype(q.dtype)


class CompressedSparseAttention(nn.Module):
    """One layer's attention (HF names ``q_a_proj``, ``kv_proj``, ``o_a_proj`` ...):
    low-rank queries, a grouped low-rank output (``o_groups`` block-diagonal
    projections), a window of FP8-rounded latents plus, when ``ratio`` > 0, the
    compressed latents the indexer picks."""

    def __init__(self, args, layer, rope):
        super().__init__()
        ratios = args.compress_ratios
        self.ratio = int(ratios[layer]) if layer < len(ratios) else 0
        self.num_heads, self.head_dim = args.num_attention_heads, args.head_dim
        self.o_groups, self.window = args.o_groups, args.sliding_window
        self.rope = rope
        self.is_kv_source = layer in args.kv_source_layer_ids
        self.is_index_source = layer in args.index_source_layer_ids
        self.q_a_proj = nn.Linear(args.hidden_size, args.q_lora_rank, bias=False)
        self.q_a_norm = nn.RMSNorm(args.q_lora_rank, eps=args.rms_norm_eps)
        self.q_b_proj = nn.Linear(args.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(args.hidden_size, self.head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(self.head_dim, eps=args.rms_norm_eps)
        self.o_a_proj = SwitchLinear(self.num_heads * self.head_dim // self.o_groups,
                                     args.o_lora_rank, self.o_groups)
        self.o_b_proj = nn.Linear(self.o_groups * args.o_lora_rank, args.hidden_size, bias=False)
        self.sinks = mx.zeros((self.num_heads,), dtype=mx.float32)
        if self.is_kv_source:
            self.compressor = Compressor(args.hidden_size, self.head_dim, int(ratios[layer]),
                                         args.rms_norm_eps)
        if self.is_index_source:
            self.indexer = Indexer(args, int(ratios[layer]), self.is_kv_source,
                                   layer == args.candidate_source_layer_id)

    def __call__(self, x, start, state, shared):
        """One row: ``x`` ``(1, L, D)`` at positions ``start ..``; updates ``state``."""
        _, length, _ = x.shape
        q_latent = self.q_a_norm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).reshape(1, length, self.num_heads, self.head_dim)
        q = self.rope(q, start)
        kv = fp8_round_trip(self.rope(self.kv_norm(self.kv_proj(x)), start), 32)
        previous = state["window"]
        window = _append(previous, kv)
        state["window"] = window[:, -self.window:]
        prev = 0 if previous is None else previous.shape[1]
        kvs, indices = [window], [window_indices(prev, length, self.window)[None]]
        if self.ratio:
            if self.is_kv_source:
                self._compress(x, start, state, shared)
            if self.is_index_source:
                top, cand = self.indexer(x, q_latent, shared.get("index_k"),
                                         shared.get("candidates"), self.rope, start)
                shared["topk_idx"] = top
                if self.indexer.candidate_source:
                    shared["candidates"] = cand
            compressed, top = shared.get("compress_kv"), shared.get("topk_idx")
            if compressed is not None and top is not None and top.shape[-1] > 0:
                kvs.append(compressed)
                indices.append(top)
        out = sparse_attention(q, kvs, indices, self.sinks, self.head_dim ** -0.5)
        out = self.rope(out, start, inverse=True)
        out = self.o_a_proj(out.reshape(length, self.o_groups, 1, -1),
                            mx.arange(self.o_groups)[None])
        return self.o_b_proj(out.reshape(1, length, -1))

    def _compress(self, x, start, state, shared):
        latent, first = self.compressor(x, start, state)
        if latent is not None:
            kv = self.rope(latent, first, scale=self.ratio)
            kv = fp4_round_trip(kv, 16, e4m3_scale=True)
            state["compress_kv"] = _append(state["compress_kv"], kv)
            if self.is_index_source:
                k = self.indexer.k_norm(self.indexer.k_proj(latent))
                k = fp4_round_trip(self.rope(k, first, scale=self.ratio), 32)
                state["index_k"] = _append(state["index_k"], k)
        shared["compress_kv"] = state["compress_kv"]
        if self.is_index_source:
            shared["index_k"] = state["index_k"]
