"""mlx-lm's ``models.pipeline.PipelineMixin``: the layer-range bookkeeping that a model
written for mlx-lm inherits to run one stage of a pipeline.

This package's own pipeline parallelism (``parallel/pipeline.py``) cuts any model built
from the shared stacks without a mixin; this class serves custom models that call
mlx-lm's ``pipeline(group)`` and read ``pipeline_layers``."""


class PipelineMixin:
    """Stage bookkeeping over ``self.layers``: after ``pipeline(group)``, rank ``r``
    runs ``layers[start_idx:end_idx]``. Stages are numbered from the end (rank 0 runs
    the last layers), as in mlx-lm; the layers before ``start_idx`` are kept as None
    so layer indices (and weight names) stay those of the whole model."""

    def __init__(self):
        super().__init__()
        self.pipeline_rank, self.pipeline_size = 0, 1
        self.start_idx, self.end_idx = 0, None

    @property
    def pipeline_layers(self):
        """The layers this stage runs."""
        return self.layers[self.start_idx:self.end_idx]

    def pipeline(self, group, split=None):
        """Keep this rank's layers. ``split``: layers per rank, rank 0 first (default:
        even, the low ranks taking the remainder). ValueError for a split that does
        not cover the layers once with one or more per rank."""
        rank, size, n = group.rank(), group.size(), len(self.layers)
        if split is None:
            base, extra = divmod(n, size)
            split = [base + (r < extra) for r in range(size)]
        if len(split) != size:
            raise ValueError(f"split has {len(split)} entries for group size {size}")
        if min(split) <= 0 or sum(split) != n:
            raise ValueError(f"split {split} must be positive and sum to {n} layers")
        self.pipeline_rank, self.pipeline_size = rank, size
        self.start_idx = sum(split[rank + 1:])  # the ranks after this one run the first
        self.end_idx = self.start_idx + split[rank]
        kept = self.layers[:self.end_idx]
        self.layers = [None] * self.start_idx + kept[self.start_idx:]
