"""mlx-lm's ``utils.pipeline_load``: ``sharded_load`` with the layers split over every
rank of ``mx.distributed.init()`` (pipeline parallelism)."""

import mlx.core as mx

from .load import sharded_load


def pipeline_load(repo, return_config=False):
    """Load ``repo`` with one contiguous range of layers per rank of the default group
    (the whole model on a single rank). Returns ``(model, tokenizer)``, plus the config
    when ``return_config``."""
    return sharded_load(repo, mx.distributed.init(), None, return_config)
