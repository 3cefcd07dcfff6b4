"""Where generation runs: the stream (mlx-lm's ``stream=`` argument and its
``generation_stream``) and the wired-memory limit on devices that have one.

Apple silicon GPUs page out memory that is not wired; keeping the weights and caches
wired at the recommended working-set size avoids stalls on large models, which is why
mlx-lm wraps generation in :func:`wired_limit`. Devices that report no recommended
size (the CPU backend, CUDA) are left as they are: every function here is a no-op there.
"""

import contextlib

import mlx.core as mx
from mlx.utils import tree_reduce

# mlx-lm's name: a stream of the default device for generation, one per thread. Our
# generation runs on the default stream unless a caller passes ``stream=`` (this one or
# any other), so it only changes anything for code that passes it.
generation_stream = mx.new_thread_local_stream(mx.default_device())


def maybe_set_recommended_wired_limit():
    """Wire up to the device's recommended working set; return the previous limit,
    or None (nothing changed) when the device reports no recommended size."""
    recommended = mx.device_info().get("max_recommended_working_set_size")
    if recommended is None:
        return None
    return mx.set_wired_limit(recommended)


@contextlib.contextmanager
def wired_limit(model, streams=None):
    """Keep memory wired at the recommended size while the block runs (see above).

    Warns when the model's weights alone take over 90% of that size (generation will
    page). On exit, waits for ``streams`` (default: all work) before restoring the old
    limit: the limit must not change under an asynchronous evaluation.
    """
    old_limit = maybe_set_recommended_wired_limit()
    if old_limit is None:
        yield
        return
    model_bytes = tree_reduce(lambda acc, x: acc + x.nbytes if isinstance(x, mx.array) else acc,
                              model, 0)
    recommended = mx.device_info()["max_recommended_working_set_size"]
    if model_bytes > 0.9 * recommended:
        print(f"[WARNING] the model takes {model_bytes // 2**20} MB, close to the device's "
              f"recommended working set of {recommended // 2**20} MB: generation will be slow")
    try:
        yield
    finally:
        for s in streams or []:
            mx.synchronize(s)
        if not streams:
            mx.synchronize()
        mx.set_wired_limit(old_limit)


def on_stream(stream):
    """A context that runs MLX work on ``stream`` (None: the default stream)."""
    return contextlib.nullcontext() if stream is None else mx.stream(stream)
