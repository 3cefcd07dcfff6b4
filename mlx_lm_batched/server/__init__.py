"""OpenAI-compatible HTTP server on continuous batching.

Every request becomes rows of ONE running :class:`~mlx_lm_batched.generate.BatchGenerator`
owned by a single engine thread (``engine.py``); the ASGI app (``app.py``) validates
requests, hands them to the engine and streams its events back. Run it with
``python -m mlx_lm_batched.server --model PATH``; under ``mlx.launch`` the model is sharded
(tensor parallel) and rank 0's engine (``distributed_engine.py``) drives the other ranks
through the replay protocol of ``replay.py``.
"""

from .app import create_app
from .engine import Engine, EngineConfig
from .mlx_lm_names import (
    APIHandler,
    LRUPromptCache,
    ResponseGenerator,
    SamplingArguments,
    ToolCallFormatter,
    _make_sampler,
)

__all__ = ["create_app", "Engine", "EngineConfig", "APIHandler", "LRUPromptCache",
           "ResponseGenerator", "SamplingArguments", "ToolCallFormatter"]
