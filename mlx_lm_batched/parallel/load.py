"""Loading a model sharded over ``mx.distributed`` groups: mlx-lm's ``sharded_load``, and
the step every sharded load ends with (cut, materialise this rank's part, wait for all)."""

import mlx.core as mx

from ..loading.load import load
from .pipeline import pipeline_model
from .shard import shard_model


def finish_sharding(model, group, mode="tensor"):
    """Shard ``model`` (weights may be lazy) over ``group`` — heads and columns for
    ``mode="tensor"`` (or ``"auto"``), layer ranges for ``"pipeline"`` — materialise this
    rank's part and wait until every rank has; returns ``model``."""
    if mode == "pipeline":
        pipeline_model(model, group)
    else:
        shard_model(model, group)
    mx.eval(model.parameters())
    mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu, group=group))
    return model


def sharded_load(repo, pipeline_group=None, tensor_group=None, return_config=False, *,
                 tokenizer_config=None, trust_remote_code=False):
    """Load a model sharded over ``mx.distributed`` groups (mlx-lm's ``sharded_load``).

    ``tensor_group`` splits attention heads and MLP/expert columns over its ranks (see
    :mod:`mlx_lm_batched.parallel.tensor`); ``pipeline_group`` splits the layers into one
    contiguous range per rank (see :mod:`mlx_lm_batched.parallel.pipeline`); with neither given,
    tensor parallelism over ``mx.distributed.init()``. The weights are read lazily and
    cut before they are evaluated, so each rank materialises only its part. Both groups
    with more than one rank each raise ``ValueError`` (not supported: MLX's ring backend
    cannot split a group, so the combination could not be tested).
    Returns ``(model, tokenizer)``, plus the config when ``return_config``.
    """
    pipeline = pipeline_group is not None and pipeline_group.size() > 1
    if pipeline and tensor_group is not None and tensor_group.size() > 1:
        raise ValueError("sharded_load: pipeline_group and tensor_group cannot both have more "
                         "than one rank; pass one of them")
    if pipeline_group is None and tensor_group is None:
        tensor_group = mx.distributed.init()
    model, tokenizer, config = load(repo, tokenizer_config=tokenizer_config, lazy=True,
                                    return_config=True, trust_remote_code=trust_remote_code)
    if pipeline:
        finish_sharding(model, pipeline_group, "pipeline")
    elif tensor_group is not None:
        finish_sharding(model, tensor_group)
    else:  # a pipeline group of one rank: the whole model here
        mx.eval(model.parameters())
    return (model, tokenizer, config) if return_config else (model, tokenizer)


def load_for_device(path, dequantize, group=None, mode="auto", **load_kwargs):
    """The model the CLI and the server run: ``(model, tokenizer, weights)``.

    Loads ``path`` (lazily under ``group``), puts its weights in the form
    ``loading.dequantize.weights_for_device`` picks for ``dequantize`` (True, or False /
    None: as stored) against the memory available now, then, under
    ``group``, shards it (``mode``: ``finish_sharding``'s) after dequantizing, so the float
    layers are the ones split. ``weights``: the summary's words for that form.
    ``load_kwargs`` go to :func:`~mlx_lm_batched.loading.load.load`, whose errors pass
    through; an asked dequantizing that cannot fit raises
    ``loading.dequantize.DequantizeDoesNotFit`` (one line)."""
    from ..engine.kv_budget import available_memory
    from ..loading.dequantize import weights_for_device

    model, tokenizer = load(path, lazy=group is not None, **load_kwargs)
    weights = weights_for_device(model, dequantize, available_memory(),
                                 shards=group.size() if group is not None else 1,
                                 evaluate=group is None)
    if group is not None:
        finish_sharding(model, group, mode)
    return model, tokenizer, weights
