"""Cross-layer attention (CLA, Hunyuan): in each group of ``share_factor``
consecutive layers only the first projects keys and values; the others attend with
that layer's raw key/value projections (each still applies its own RoPE, key norm
and cache). The projections pass from layer to layer within one forward call
through a :class:`KVShare`, so the layers keep the shared ``Attention`` call."""

from .layers import Attention


class KVShare:
    """The producing layer's raw ``(keys, values)`` projections for the layers after
    it in the same forward call. A plain object, so it is no parameter of the model."""

    __slots__ = ("kv",)

    def __init__(self):
        self.kv = None


class CrossLayerAttention(Attention):
    """:class:`~.layers.Attention` that hands its key/value projections to later
    layers (``produces``) or, without ``k_proj``/``v_proj`` of its own, takes them
    from ``share``; ``last``: the group's last layer, which drops the shared arrays
    so they are not kept past the call."""

    def __init__(self, *args, share, produces, last=False, **kwargs):
        super().__init__(*args, **kwargs)
        if self.fused_qkv:
            raise ValueError("cross-layer attention needs separate q/k/v projections")
        self.share = share
        self.produces = produces
        self.last = last
        if not produces:
            del self.k_proj, self.v_proj

    def project(self, x):
        if self.produces:
            q, k, v = super().project(x)
            self.share.kv = None if self.last else (k, v)
            return q, k, v
        if self.share.kv is None:
            raise ValueError("cross-layer attention called before the layer that projects "
                             "its keys and values")
        k, v = self.share.kv
        if self.last:
            self.share.kv = None
        return self.q_proj(x), k, v
