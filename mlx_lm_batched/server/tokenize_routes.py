"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shapes, for clients that count
or build prompts in the served model's tokens (evaluation harnesses, load generators)."""

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


def add_tokenize_routes(app, engine, config, check_model):
    """Register the two routes on ``app`` (``check_model(name)`` raises 404 for others)."""
    tokenizer = engine.tokenizer

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
