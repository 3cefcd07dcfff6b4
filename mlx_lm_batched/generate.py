"""mlx-lm's ``mlx_lm.generate``: the generation API (``api/``), ``BatchGenerator``
(``sched/``) and the stop-sequence helpers under the names code written for mlx-lm
imports. ``python -m mlx_lm_batched.generate`` runs the command line
(``cli/generate.py``); the entry point is first so that Ctrl-C while MLX loads ends
with one line instead of a traceback."""

if __name__ == "__main__":
    from .cli.entry import run_generate

    run_generate()

from .api.batch import batch_generate, stream_batch_generate
from .api.generate import generate, generate_step, stream_generate
from .cache.quantized import maybe_quantize_kv_cache
from .api.responses import BatchResponse, BatchStreamResponse, GenerationResponse
from .api.speculative import speculative_generate_step
from .sched.stats import BatchStats
from .cli.generate import main
from .sampling.stop_sequences import StopSequences, make_stop_sequences
from .sched.generator import BatchGenerator
from .tool_parsers.state_machine import TextStateMachine

__all__ = ["BatchGenerator", "BatchResponse", "BatchStats", "BatchStreamResponse",
           "GenerationResponse", "StopSequences", "TextStateMachine", "batch_generate", "generate",
           "generate_step", "main", "make_stop_sequences", "maybe_quantize_kv_cache",
           "speculative_generate_step", "stream_batch_generate", "stream_generate"]
