"""mlx-lm's ``mlx_lm.generate``: the generation API (``api/``), ``BatchGenerator``
(``sched/``) and the stop-sequence helpers under the names code written for mlx-lm
imports. ``python -m mlx_lm_batched.generate`` runs the command line
(``cli/generate.py``); the entry point is first so that Ctrl-C while MLX loads ends
with one line instead of a traceback."""

if __name__ == "__main__":
    from .cli.entry import run_generate

    run_generate()

from .api.batch import batch_generate, stream_batch_generate
from .api.device import generation_stream, maybe_set_recommended_wired_limit, wired_limit
from .api.generate import generate, generate_step, stream_generate
from .cache.quantized import maybe_quantize_kv_cache
from .api.responses import BatchResponse, BatchStreamResponse, GenerationResponse
from .api.speculative import speculative_generate_step
from .sched.stats import BatchStats
from .cli.args import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIN_P,
    DEFAULT_MIN_TOKENS_TO_KEEP,
    DEFAULT_MODEL,
    DEFAULT_PREFILL_STEP_SIZE,
    DEFAULT_PROMPT,
    DEFAULT_QUANTIZED_KV_START,
    DEFAULT_SEED,
    DEFAULT_TEMP,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    DEFAULT_XTC_PROBABILITY,
    DEFAULT_XTC_THRESHOLD,
    str2bool,
)
from .cli.args import build_parser as setup_arg_parser
from .cli.generate import main
from .loading.load import load
from .models.cache import (
    QuantizedKVCache,
    can_trim_prompt_cache,
    load_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)
from .sampling.samplers import greedy_sampler, make_sampler
from .sampling.stop_sequences import (
    StopSequenceMatcher,
    StopSequences,
    make_stop_matcher,
    make_stop_sequences,
)
from .sched.generator import BatchGenerator
from .tool_parsers.state_machine import TextStateMachine, make_text_state_machine

__all__ = ["BatchGenerator", "BatchResponse", "BatchStats", "BatchStreamResponse",
           "DEFAULT_MAX_TOKENS", "DEFAULT_MIN_P", "DEFAULT_MIN_TOKENS_TO_KEEP", "DEFAULT_MODEL",
           "DEFAULT_PREFILL_STEP_SIZE", "DEFAULT_PROMPT", "DEFAULT_QUANTIZED_KV_START",
           "DEFAULT_SEED", "DEFAULT_TEMP", "DEFAULT_TOP_K", "DEFAULT_TOP_P",
           "DEFAULT_XTC_PROBABILITY", "DEFAULT_XTC_THRESHOLD", "GenerationResponse",
           "QuantizedKVCache", "StopSequenceMatcher", "StopSequences", "TextStateMachine",
           "batch_generate", "can_trim_prompt_cache", "generate", "generate_step",
           "generation_stream", "greedy_sampler", "load", "load_prompt_cache", "main",
           "make_prompt_cache", "make_sampler", "make_stop_matcher", "make_stop_sequences",
           "make_text_state_machine", "maybe_quantize_kv_cache",
           "maybe_set_recommended_wired_limit", "setup_arg_parser", "speculative_generate_step",
           "str2bool", "stream_batch_generate", "stream_generate", "trim_prompt_cache",
           "wired_limit"]
