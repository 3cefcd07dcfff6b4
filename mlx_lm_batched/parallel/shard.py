"""``shard_model``: tensor parallelism of a whole model, driven by its layer classes.

The walk meets each module once: a family's own layer (``recurrent.SHARDERS``, or
``refused.SHARDERS`` for those refused by name) or a
shared block (``tensor.shard_shared_block``) is split in place; anything else is
walked into. A linear layer met outside any known block is refused by name, unless it is
one every rank keeps whole (the LM head, MoE routers)."""

import mlx.core as mx
import mlx.nn as nn

from . import recurrent, refused
from .tensor import LINEARS, REPLICATED, shard_shared_block


# Family layers with a sharder of their own, or refused by name.
SHARDERS = {**recurrent.SHARDERS, **refused.SHARDERS}


def _walk(module, group, path, parent):
    if isinstance(module, LINEARS):
        # A router's own projection (Bailing's ``gate.gate_proj``) is replicated too.
        if not REPLICATED & set(path.split(".")[-2:]):
            raise ValueError(f"cannot shard layer '{path}' of {type(parent).__name__}: the sharder "
                             "knows Attention, MLP, DenseMLP, SwitchGLU, SwitchMLP and "
                             "MultiHeadLatentAttention blocks")
        return
    custom = SHARDERS.get(type(module))
    if custom is not None:
        custom(module, group, path)
        return
    if shard_shared_block(module, group, path):
        return
    for name, child in module.children().items():
        items = child if isinstance(child, list) else [child]
        for i, c in enumerate(items):
            if isinstance(c, nn.Module):
                sub = f"{path}.{name}.{i}" if isinstance(child, list) else f"{path}.{name}"
                _walk(c, group, sub.lstrip("."), module)


def shard_model(model, group=None):
    """Tensor-parallel ``model`` in place over ``group`` (default: ``mx.distributed.init()``).

    Weights may still be lazy (unevaluated): only each rank's slices are materialised when
    the caller evaluates the parameters. A group of size 1 leaves the model unchanged.
    Raises ``ValueError`` naming the first layer the sharder does not know, or one whose
    heads or quantization groups cannot be split over the group. Returns ``model``.
    """
    group = group or mx.distributed.init()
    if group.size() > 1:
        _walk(model, group, "", None)
    return model
