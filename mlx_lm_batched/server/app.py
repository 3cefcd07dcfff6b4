"""The ASGI app: OpenAI's routes (chat, completions, embeddings, Responses, Messages),
vLLM's tokenizer routes, health and metrics, with OpenAI-shaped errors."""

import asyncio
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse

from ..sampling.grammar import grammar_tokenizer
from .anthropic_messages import serve_messages
from .embeddings import add_embedding_routes, embedding_setup
from .errors import APIError
from .handlers import serve
from .job_prep import JobSpec
from .middleware import AuthMiddleware, StatusCounter, read_json
from .openai_responses import serve_responses
from .schema import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_messages,
    generation_params,
    parse,
)
from .tokenize_routes import add_tokenize_routes
from .tool_calls import chat_output
from .tool_format import resolve_tool_format

log = logging.getLogger("mlx_lm_batched.server")


@dataclass
class ServerConfig:
    """HTTP-side settings (the engine has its own)."""

    model_id: str  # the name /v1/models lists and requests may give
    model_path: Optional[str] = None  # also accepted as a model name
    api_key: Optional[str] = None
    max_body_bytes: int = 4 << 20
    max_tokens: int = 4096  # per request
    max_n: int = 8
    default_temperature: float = 0.0
    tool_parser: Optional[str] = None  # a tool_parsers family name; None: from the template
    adapters: tuple = ()  # model names of the adapters, slots 1..n (``--adapters``)
    tool_format: Any = None  # tool_format.ToolFormat; None: decided by create_app

    def adapter_slot(self, name):
        """The adapter slot a request's ``model`` name picks: 0 for the base model (or no
        name), ``k`` for the k-th adapter (names are checked by the routes first)."""
        return self.adapters.index(name) + 1 if name in self.adapters else 0


def _accepted_names(config):
    names = {config.model_id}
    if config.model_path:
        names |= {config.model_path, os.path.basename(os.path.normpath(config.model_path))}
    return names


def create_app(engine, config):
    """The FastAPI app serving ``engine`` (an :class:`~.engine.Engine`, already started).
    Exits with one line when ``--tool-call-parser`` cannot work with the chat template."""
    if config.tool_format is None:
        try:
            tool_format = resolve_tool_format(engine.tokenizer, config.tool_parser)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        config = dataclasses.replace(config, tool_format=tool_format)
    log.info("tool calls: %s", config.tool_format.describe())
    app = FastAPI(title="mlx_lm_batched", docs_url=None, redoc_url=None, openapi_url=None)
    names = _accepted_names(config) | set(config.adapters)
    created = int(time.time())

    @app.exception_handler(APIError)
    async def api_error(_request, exc):
        return exc.response()

    @app.exception_handler(HTTPException)
    async def http_error(_request, exc):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), None, code).response()

    @app.exception_handler(Exception)
    async def server_error(_request, exc):
        return JSONResponse(APIError(500, f"Internal error: {exc}", None, "internal_error").body(),
                            status_code=500)

    def check_model(name):
        if name is not None and name not in names:
            served = ", ".join(f"'{n}'" for n in (config.model_id, *config.adapters))
            raise APIError(404, f"The model '{name}' does not exist; this server serves "
                           f"{served}.", "model", "model_not_found")
        return name if name in config.adapters else config.model_id

    async def _grammar_ready(params):
        # The grammar engine's view of the vocabulary takes seconds to build once per
        # model: built here, off the engine thread, so the running batch never waits.
        if params.constraint is not None:
            await asyncio.to_thread(grammar_tokenizer, engine.tokenizer)

    @app.get("/health")
    async def health():
        if not engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "mlx_lm_batched",
             **({"parent": config.model_id} if name != config.model_id else {})}
            for name in (config.model_id, *config.adapters)]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = parse(ChatCompletionRequest, await read_json(request, config.max_body_bytes))
        name = check_model(req.model)
        params = generation_params(req, config, config.default_temperature)
        messages, kwargs = chat_messages(req), dict(req.chat_template_kwargs or {})
        output = chat_output(engine.tokenizer, messages, req.tools, req.tool_choice, kwargs,
                             config.tool_parser, config.tool_format)
        spec = JobSpec(params, messages=messages, tools=output.tools_for_template,
                       template_kwargs=kwargs, output=output, adapter=config.adapter_slot(name),
                       tool_format=config.tool_format)
        await _grammar_ready(params)
        return await serve(engine, spec, "chat", name, request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = parse(CompletionRequest, await read_json(request, config.max_body_bytes))
        name = check_model(req.model)
        params = generation_params(req, config, config.default_temperature)
        prompt = req.prompt
        several = isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))
        spec = JobSpec(params, prompts=list(prompt) if several else [prompt],
                       adapter=config.adapter_slot(name))
        if len(spec.prompts) * params.n > config.max_n:
            raise APIError(400, f"{len(spec.prompts)} prompts times n={params.n} is over this "
                           f"server's limit of {config.max_n} choices.", "prompt", "invalid_value")
        await _grammar_ready(params)
        return await serve(engine, spec, "text", name, request)

    @app.post("/v1/messages")
    async def anthropic_messages(request: Request):
        data = await read_json(request, config.max_body_bytes)
        name = check_model(data.get("model") if isinstance(data, dict) else None)
        return await serve_messages(engine, config, data, name, _grammar_ready, request)

    @app.post("/v1/responses")
    async def openai_responses(request: Request):
        data = await read_json(request, config.max_body_bytes)
        name = check_model(data.get("model") if isinstance(data, dict) else None)
        return await serve_responses(engine, config, data, name, _grammar_ready, request)

    add_tokenize_routes(app, engine, config, check_model)
    add_embedding_routes(app, engine, config, check_model,
                         embedding_setup(engine.model, config.model_path))
    paths = [r.path for r in app.routes]
    wrapped = StatusCounter(AuthMiddleware(app, config.api_key), engine.metrics, paths)
    wrapped.fastapi_app = app
    return wrapped
