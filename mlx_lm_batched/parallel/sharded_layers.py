"""Layers whose output is summed over a ``mx.distributed`` group (tensor parallelism).

Each class is its plain layer with the same parameter names, holding only this rank's
slice of the input dimension: it computes the partial product, all-reduces it with
``mx.distributed.all_sum`` and adds the (unsliced) bias once, after the sum. The
sharder (``mlx_lm_batched.parallel.tensor``) switches a loaded layer's class to these.
"""

import mlx.core as mx
import mlx.nn as nn

from ..layers.moe import QuantizedSwitchLinear, SwitchLinear
from ..layers.norms import RMSNorm


def _sum(x, group):
    return mx.distributed.all_sum(x, group=group)


class ShardedToAllLinear(nn.Linear):
    """``nn.Linear`` over this rank's input columns; the result is summed over ``group``."""

    group = None

    def __call__(self, x):
        y = _sum(x @ self["weight"].T, self.group)
        return y + self["bias"] if "bias" in self else y


class QuantizedShardedToAllLinear(nn.QuantizedLinear):
    """``nn.QuantizedLinear`` over this rank's input groups, summed over ``group``."""

    group = None

    def __call__(self, x):
        y = mx.quantized_matmul(x, self["weight"], scales=self["scales"], biases=self.get("biases"),
                                transpose=True, group_size=self.group_size, bits=self.bits,
                                mode=self.mode)
        y = _sum(y, self.group)
        return y + self["bias"] if "bias" in self else y


def _expert_bias(out, bias, indices):
    return out + mx.expand_dims(bias[indices], -2)


class ShardedToAllSwitchLinear(SwitchLinear):
    """``SwitchLinear`` over this rank's slice of each expert's input, summed over ``group``."""

    group = None

    def __call__(self, x, indices, sorted_indices=False):
        out = mx.gather_mm(x, self.weight.swapaxes(-1, -2), rhs_indices=indices,
                           sorted_indices=sorted_indices)
        out = _sum(out, self.group)
        return _expert_bias(out, self.bias, indices) if "bias" in self else out


class QuantizedShardedToAllSwitchLinear(QuantizedSwitchLinear):
    """Quantized ``ShardedToAllSwitchLinear``."""

    group = None

    def __call__(self, x, indices, sorted_indices=False):
        out = mx.gather_qmm(x, self.weight, self.scales, self.biases, rhs_indices=indices,
                            transpose=True, group_size=self.group_size, bits=self.bits,
                            mode=self.mode, sorted_indices=sorted_indices)
        out = _sum(out, self.group)
        return _expert_bias(out, self.bias, indices) if "bias" in self else out


class ShardedRMSNorm(RMSNorm):
    """RMS norm of a vector whose features are split over ``group`` (OLMo 2's norm of the
    whole q/k projection): the sum of squares is all-reduced, the weight is this rank's
    slice. ``full_dims`` is the unsplit feature count."""

    group = None
    full_dims = None

    def __call__(self, x):
        xf = x.astype(mx.float32)
        ss = _sum(mx.sum(xf * xf, axis=-1, keepdims=True), self.group)
        w = 1.0 + self.weight if self.zero_centered else self.weight
        return (xf * mx.rsqrt(ss / self.full_dims + self.eps)).astype(x.dtype) * w


SHARDED_TO_ALL = {
    nn.Linear: ShardedToAllLinear,
    nn.QuantizedLinear: QuantizedShardedToAllLinear,
    SwitchLinear: ShardedToAllSwitchLinear,
    QuantizedSwitchLinear: QuantizedShardedToAllSwitchLinear,
}
