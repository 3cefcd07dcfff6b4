"""``POST /v1/embeddings`` (OpenAI's embeddings API) on the served model.

Inputs are a string, a list of strings, a list of token ids or a list of them;
``encoding_format`` ``float`` or ``base64`` (little-endian float32, as OpenAI sends);
``dimensions`` only for a model whose config declares Matryoshka dimensions
(``is_matryoshka`` / ``matryoshka_dimensions``, vLLM's keys): the vector is cut, then
normalized. Pooling follows the checkpoint's sentence-transformers files
(``modules.json``, ``1_Pooling/config.json``, a ``Normalize`` module) when present:
last-token for Qwen3-Embedding-style decoders; otherwise the mean over the real tokens,
normalized (OpenAI returns unit vectors). The vectors are computed on the engine thread
(``Engine.run``), between batch steps, each input as a row of its own, so a vector is
the same bits as the input embedded alone (``engine/embeddings.py``).
"""

import asyncio
import base64
import json
import os
from dataclasses import dataclass, replace
from typing import List, Literal, Optional, Union

from fastapi import Request
from pydantic import BaseModel, Field

from ..engine.embeddings import Pooling, embed, embedding_support
from ..loading.load import get_model_path
from .errors import APIError
from .middleware import read_json
from .schema import _CONFIG, parse

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request

# sentence-transformers' pooling flags -> engine/embeddings.py's modes
_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean",
          "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}


class EmbeddingRequest(BaseModel):
    model_config = _CONFIG
    model: Optional[str] = None
    input: Union[str, List[str], List[int], List[List[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1)


@dataclass(frozen=True)
class EmbeddingSetup:
    """The model's embedding settings: ``pooling``; ``matryoshka``: None (``dimensions``
    refused), True (any size up to ``size``) or the declared sizes; ``size``: the
    hidden size (None: unknown until a vector is made); ``refusal``: why this model
    cannot embed (None: it can)."""

    pooling: Pooling = Pooling()
    matryoshka: Union[None, bool, tuple] = None
    size: Optional[int] = None
    refusal: Optional[str] = None


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def sentence_transformers_pooling(model_dir):
    """The :class:`Pooling` a sentence-transformers checkpoint declares, or None when it
    has no ``modules.json``; ValueError for a pooling this server does not compute."""
    modules = _read(os.path.join(model_dir, "modules.json"))
    if not isinstance(modules, list):
        return None
    mode, normalize = "mean", False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Normalize"):
            normalize = True
        elif kind.endswith("Pooling"):
            config = _read(os.path.join(model_dir, module.get("path", ""), "config.json")) or {}
            modes = [_MODES[k] for k in _MODES if config.get(k)]
            other = [k for k, v in config.items() if k.startswith("pooling_mode") and v
                     and k not in _MODES]
            if other or len(modes) > 1:
                raise ValueError(f"its pooling ({', '.join(other or modes)}) is not one this "
                                 "server computes (one of: last token, mean, cls, max)")
            mode = modes[0] if modes else mode
    return Pooling(mode, normalize)


def embedding_setup(model, model_dir):
    """The :class:`EmbeddingSetup` of ``model`` loaded from ``model_dir`` (may be None)."""
    refusal = embedding_support(model)
    if refusal is not None:
        return EmbeddingSetup(refusal=f"This model cannot serve embeddings: {refusal}.")
    if model_dir and not os.path.isdir(model_dir) and not model_dir.endswith(".gguf"):
        try:  # a hub repo: its snapshot, already fetched by the load
            model_dir = str(get_model_path(model_dir))
        except (ValueError, OSError):
            model_dir = None
    if not model_dir or not os.path.isdir(model_dir):
        return EmbeddingSetup()
    try:
        pooling = sentence_transformers_pooling(model_dir) or Pooling()
    except ValueError as e:
        return EmbeddingSetup(refusal=f"This model cannot serve embeddings: {e}.")
    config = _read(os.path.join(model_dir, "config.json")) or {}
    dims = config.get("matryoshka_dimensions")
    matryoshka = tuple(dims) if dims else (True if config.get("is_matryoshka") else None)
    size = config.get("hidden_size")
    return EmbeddingSetup(pooling, matryoshka, size if isinstance(size, int) else None)


def _pooling(setup, dimensions):
    if dimensions is None or dimensions == setup.size:
        return setup.pooling
    if setup.matryoshka is None:
        raise APIError(400, "This model does not support 'dimensions' (its config declares "
                       "no Matryoshka dimensions: is_matryoshka / matryoshka_dimensions).",
                       "dimensions", "invalid_value")
    if isinstance(setup.matryoshka, tuple) and dimensions not in setup.matryoshka:
        raise APIError(400, f"Invalid value for 'dimensions': {dimensions}; this model "
                       f"supports {', '.join(map(str, setup.matryoshka))}.", "dimensions",
                       "invalid_value")
    if setup.size is not None and dimensions > setup.size:
        raise APIError(400, f"Invalid value for 'dimensions': {dimensions} is over the "
                       f"model's {setup.size}.", "dimensions", "invalid_value")
    return replace(setup.pooling, dimensions=dimensions)


def _token_lists(inputs, tokenizer, vocab_size, context_length):
    """Token lists of the request's inputs; APIError(400) naming 'input'."""
    if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
        inputs = [inputs]
    if not inputs:
        raise APIError(400, "'input' is empty.", "input", "invalid_value")
    if len(inputs) > MAX_INPUTS:
        raise APIError(400, f"'input' has {len(inputs)} items; at most {MAX_INPUTS}.", "input",
                       "invalid_value")
    prompts = []
    for i, item in enumerate(inputs):
        ids = tokenizer.encode(item) if isinstance(item, str) else list(item)
        if not ids:
            raise APIError(400, f"'input[{i}]' is empty.", "input", "invalid_value")
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(400, f"Invalid value for 'input[{i}]': token id {bad} is outside the "
                           f"vocabulary [0, {vocab_size}).", "input", "invalid_value")
        if context_length is not None and len(ids) > context_length:
            raise APIError(400, f"This model's maximum context length is {context_length} "
                           f"tokens, but 'input[{i}]' has {len(ids)} tokens.", "input",
                           "context_length_exceeded")
        prompts.append(ids)
    return prompts


def _encoded(vector, encoding_format):
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


class EngineWork:
    """``fn()`` for the engine thread (``Engine.run``); ``future`` (on the event loop that
    made it) gets its result or exception."""

    def __init__(self, fn):
        self.fn = fn
        self.loop = asyncio.get_running_loop()
        self.future = self.loop.create_future()

    def __call__(self):
        try:
            result, error = self.fn(), None
        except Exception as e:  # an APIError for the client, or a bug (a 500)
            result, error = None, e
        self.loop.call_soon_threadsafe(self._deliver, result, error)

    def _deliver(self, result, error):
        if not self.future.cancelled():
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)


def add_embedding_routes(app, engine, config, check_model, setup):
    """Register ``POST /v1/embeddings`` on ``app`` for ``setup`` (an
    :class:`EmbeddingSetup`); ``check_model(name)`` raises 404 for other names."""

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        req = parse(EmbeddingRequest, await read_json(request, config.max_body_bytes))
        name = check_model(req.model)
        if name in config.adapters:
            raise APIError(400, "Embeddings are served for the base model only, not for "
                           f"adapter '{name}'.", "model", "invalid_value")
        if setup.refusal is not None or not engine.embeds:
            raise APIError(400, setup.refusal or "This server's distributed mode does not "
                           "serve embeddings.", "model", "unsupported_model")
        pooling = _pooling(setup, req.dimensions)

        def work():  # on the engine thread: it owns the tokenizer and the model
            prompts = _token_lists(req.input, engine.tokenizer, engine.vocab_size,
                                   engine.context_length)
            vectors = embed(engine.model, prompts, pooling)
            if pooling.dimensions is not None and vectors[0].shape[0] < pooling.dimensions:
                raise APIError(400, f"Invalid value for 'dimensions': {pooling.dimensions} is "
                               f"over the model's {vectors[0].shape[0]}.", "dimensions",
                               "invalid_value")
            return vectors, sum(len(p) for p in prompts)

        job = EngineWork(work)
        engine.run(job)
        vectors, tokens = await job.future
        return {"object": "list", "model": name, "usage": {"prompt_tokens": tokens,
                                                           "total_tokens": tokens},
                "data": [{"object": "embedding", "index": i,
                          "embedding": _encoded(v, req.encoding_format)}
                         for i, v in enumerate(vectors)]}

