"""``POST /tokenize``, ``POST /detokenize`` and ``GET /tokenizer_info`` in vLLM's shapes,
for clients that count or build prompts in the served model's tokens (evaluation
harnesses such as lm-eval's remote tokenizer, load generators)."""

from typing import List, Optional

from fastapi import Request
from pydantic import BaseModel, Field

from .errors import APIError
from .middleware import read_json
from .schema import _CONFIG, Message, chat_messages, parse


class TokenizeRequest(BaseModel):
    """A ``prompt`` (text), or chat ``messages`` rendered by the chat template."""

    model_config = _CONFIG
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[List[Message]] = Field(None, min_length=1)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = _CONFIG
    model: Optional[str] = None
    tokens: List[int]


# HF tokenizers write "no limit" as int(1e30); the server's context is the real limit.
_NO_LIMIT = 10**20


def _jsonable(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    content = getattr(value, "content", None)  # an AddedToken
    return content if isinstance(content, str) else str(value)


def tokenizer_info(tokenizer, context_length):
    """vLLM's ``/tokenizer_info`` body: the tokenizer's configuration (its init kwargs),
    ``tokenizer_class``, the chat template, and the special tokens with their ids;
    ``model_max_length`` is the served context when the tokenizer sets no limit."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # the wrapped HF tokenizer
    info = {k: _jsonable(v) for k, v in (getattr(hf, "init_kwargs", None) or {}).items()
            if k != "added_tokens_decoder"}  # the vocabulary's added tokens: /tokenize has them
    info["tokenizer_class"] = type(hf).__name__
    for kind in ("bos", "eos", "pad", "unk"):
        token = getattr(hf, f"{kind}_token", None)
        info[f"{kind}_token"] = _jsonable(token)
        info[f"{kind}_token_id"] = getattr(hf, f"{kind}_token_id", None) if token else None
    info["eos_token_ids"] = sorted(int(t) for t in getattr(tokenizer, "eos_token_ids", ()) or ())
    limit = getattr(hf, "model_max_length", None)
    info["model_max_length"] = (context_length if not isinstance(limit, int) or limit >= _NO_LIMIT
                                else limit)
    info["max_model_len"] = context_length
    template = getattr(tokenizer, "_chat_template", None)  # the wrapper's own, if a string
    template = template if isinstance(template, str) else getattr(hf, "chat_template", None)
    if isinstance(template, str):
        info["chat_template"] = template
    return info


def add_tokenize_routes(app, engine, config, check_model):
    """Register the routes on ``app`` (``check_model(name)`` raises 404 for others)."""
    tokenizer = engine.tokenizer

    @app.get("/tokenizer_info")
    async def get_tokenizer_info():
        return tokenizer_info(tokenizer, engine.context_length)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = parse(TokenizeRequest, await read_json(request, config.max_body_bytes))
        check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "Give exactly one of 'prompt' and 'messages'.", "prompt",
                           "invalid_value")
        if req.messages is not None:
            ids = tokenizer.apply_chat_template(chat_messages(req),
                                                add_generation_prompt=req.add_generation_prompt)
        else:
            ids = tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        body = {"count": len(ids), "max_model_len": engine.context_length, "tokens": list(ids)}
        if req.return_token_strs:
            body["token_strs"] = tokenizer.convert_ids_to_tokens(list(ids))
        return body

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = parse(DetokenizeRequest, await read_json(request, config.max_body_bytes))
        check_model(req.model)
        bad = next((t for t in req.tokens if not 0 <= t < engine.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"Invalid value for 'tokens': token id {bad} is outside the "
                           f"vocabulary [0, {engine.vocab_size}).", "tokens", "invalid_value")
        return {"prompt": tokenizer.decode(req.tokens)}
