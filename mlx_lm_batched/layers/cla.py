"""Cross-layer attention (CLA, Hunyuan): in each group of ``share_factor``
consecutive layers only the first projects keys and values; the others attend with
that layer's raw key/value projections (each still applies its own RoPE, key norm
and cache). The projections pass from layer to layer within one forward call
through a :class:`ProjectionRelay`, so the layers keep the shared ``Attention`` call.
(Not models/kv_sharing.py's KV sharing, where later layers reuse the source's cached,
normed and rotated keys and values and have no cache of their own.)"""

from .attention import Attention


class ProjectionRelay:
    """The producing layer's raw ``(keys, values)`` projections, passed on to the
    layers after it in the same forward call. A plain object, so it is no parameter
    of the model."""

    __slots__ = ("kv",)

    def __init__(self):
        self.kv = None


class CrossLayerAttention(Attention):
    """:class:`~.layers.Attention` that hands its key/value projections to later
    layers (``produces``) or, without ``k_proj``/``v_proj`` of its own, takes them
    from ``relay`` (the group's :class:`ProjectionRelay`); ``last``: the group's last
    layer, which drops the relayed arrays so they are not kept past the call."""

    def __init__(self, *args, relay, produces, last=False, **kwargs):
        super().__init__(*args, **kwargs)
        if self.fused_qkv:
            raise ValueError("cross-layer attention needs separate q/k/v projections")
        self.relay = relay
        self.produces = produces
        self.last = last
        if not produces:
            del self.k_proj, self.v_proj

    def project(self, x):
        if self.produces:
            q, k, v = super().project(x)
            self.relay.kv = None if self.last else (k, v)
            return q, k, v
        if self.relay.kv is None:
            raise ValueError("cross-layer attention called before the layer that projects "
                             "its keys and values")
        k, v = self.relay.kv
        if self.last:
            self.relay.kv = None
        return self.q_proj(x), k, v
