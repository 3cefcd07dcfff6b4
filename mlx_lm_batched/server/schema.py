"""Request bodies of the OpenAI API (pydantic, strict types) and the parameters they give.

Fields that do not change the output (``user``, ``metadata``, ...) are accepted and
ignored, as OpenAI clients send them; every field that changes it is honoured or
answered with a 400 (``response_format``, ``tool_choice``, vLLM's ``guided_*``). Types are strict (``"1"`` is not a number, ``1.5``
is not an integer); ranges follow OpenAI's, and the server's own limits (``max_tokens``,
``n``) are checked in :func:`generation_params`.
"""

import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .constraints import request_constraint
from .errors import APIError, validation_error

_CONFIG = ConfigDict(strict=True, extra="allow")


class StreamOptions(BaseModel):
    model_config = _CONFIG
    include_usage: bool = False


class ContentPart(BaseModel):
    model_config = _CONFIG
    type: str
    text: Optional[str] = None


class Message(BaseModel):
    model_config = _CONFIG
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[List[Dict[str, Any]]] = None
    tool_call_id: Optional[str] = None


class _Sampling(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = _CONFIG
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: float = Field(1.0, ge=0, le=1)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0, le=1)
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: Optional[float] = Field(None, gt=0)
    logit_bias: Optional[Dict[str, float]] = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    # Output constraints (server/constraints.py): OpenAI's, and vLLM's names.
    response_format: Optional[Dict[str, Any]] = None
    guided_json: Optional[Union[Dict[str, Any], str]] = None
    guided_regex: Optional[str] = None
    guided_grammar: Optional[str] = None
    # vLLM's extra sampling fields, sent by load generators and evaluation clients.
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: Optional[List[int]] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: Optional[bool] = None  # None: special tokens kept, as mlx-lm

    @field_validator("response_format")
    @classmethod
    def _format(cls, v):
        kinds = ("text", "json_object", "json_schema")
        if v is not None and v.get("type") not in kinds:
            raise ValueError(f"unsupported type {v.get('type')!r}; supported: {', '.join(kinds)}")
        return v

    @field_validator("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty")
    @classmethod
    def _finite(cls, v):
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > 16 or any(not s for s in stops):
            raise ValueError("at most 16 non-empty strings")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        for key, bias in (v or {}).items():
            if not key.isdigit():
                raise ValueError(f"keys must be token ids, got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases must be in [-100, 100], got {bias}")
        return v


class ChatCompletionRequest(_Sampling):
    messages: List[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    parallel_tool_calls: bool = True  # false: at most one call (exactly one when forced)
    chat_template_kwargs: Optional[Dict[str, Any]] = None  # e.g. {"enable_thinking": false}


class CompletionRequest(_Sampling):
    prompt: Union[str, List[int], List[str], List[List[int]]]
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    echo: bool = False
    max_tokens: Optional[int] = Field(None, ge=0)  # 0: only with echo (score the prompt)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and (not v or any(isinstance(p, (str, list)) and not p for p in v)):
            raise ValueError("must not be empty")
        if isinstance(v, list) and any(isinstance(t, int) and t < 0 for t in v):
            raise ValueError("token ids must be >= 0")
        return v


def parse(model, data):
    """Validate ``data`` (a parsed JSON value) as ``model``; APIError(400) naming the field."""
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", None, "invalid_body")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None


@dataclass
class GenerationParams:
    """What the engine needs to generate one request's rows."""

    max_tokens: Optional[int]  # None: the server's default (bounded by the context)
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: Optional[int]
    stop: List[str]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: Optional[float]
    logit_bias: Dict[int, float]
    n: int
    logprobs: bool
    top_logprobs: int
    stream: bool = False
    include_usage: bool = False
    constraint: Optional[str] = None  # a compiled llguidance grammar (server/constraints.py)
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: List[int] = field(default_factory=list)
    echo: bool = False  # completions: the prompt (and its logprobs) before the completion
    include_stop_str: bool = False  # vLLM's include_stop_str_in_output
    skip_special_tokens: bool = False  # special tokens' text left out of the output


def generation_params(req, limits, default_temperature=0.0):
    """:class:`GenerationParams` of a validated request; APIError(400) past ``limits``
    (an object with ``max_tokens`` and ``max_n``, and optionally the model's
    ``tool_format``, which decides how ``tool_choice`` constrains the output)."""
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens
    name = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise APIError(400, f"Invalid value for '{name}': {max_tokens} is over this server's "
                       f"limit of {limits.max_tokens}.", name, "invalid_value")
    if req.n > limits.max_n:
        raise APIError(400, f"Invalid value for 'n': {req.n} is over this server's limit of "
                       f"{limits.max_n}.", "n", "invalid_value")
    if isinstance(req, ChatCompletionRequest):
        logprobs, top = req.logprobs, req.top_logprobs or 0
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "'top_logprobs' requires 'logprobs' to be true.", "top_logprobs",
                           "invalid_value")
        if (req.model_extra or {}).get("echo"):  # vLLM's chat echo (the last message)
            raise APIError(400, "'echo' is supported by /v1/completions only.", "echo",
                           "unsupported_parameter")
    else:
        logprobs, top = req.logprobs is not None, req.logprobs or 0
        if max_tokens == 0 and not req.echo:
            raise APIError(400, "'max_tokens: 0' needs 'echo: true' (it scores the prompt only).",
                           "max_tokens", "invalid_value")
    temperature = default_temperature if req.temperature is None else req.temperature
    return GenerationParams(
        max_tokens=max_tokens, temperature=temperature, top_p=req.top_p, top_k=req.top_k,
        min_p=req.min_p, seed=req.seed, stop=list(req.stop or []),
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        logit_bias={int(k): float(v) for k, v in (req.logit_bias or {}).items()},
        n=req.n, logprobs=logprobs, top_logprobs=top, stream=req.stream,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        constraint=request_constraint(req, getattr(limits, "tool_format", None)), ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens, stop_token_ids=list(req.stop_token_ids or []),
        echo=getattr(req, "echo", False), include_stop_str=req.include_stop_str_in_output,
        skip_special_tokens=bool(req.skip_special_tokens),
    )


def chat_messages(req):
    """The request's messages as plain dicts for a chat template (text parts joined;
    tool-call arguments given as JSON strings become objects, as HF templates expect)."""
    out = []
    for m in req.messages:
        msg = {"role": "system" if m.role == "developer" else m.role}
        if isinstance(m.content, list):
            msg["content"] = "".join(p.text or "" for p in m.content if p.type == "text")
        else:
            msg["content"] = m.content if m.content is not None else ""
        for key in ("name", "tool_call_id"):
            if getattr(m, key) is not None:
                msg[key] = getattr(m, key)
        if m.tool_calls:
            calls = []
            for call in m.tool_calls:
                call = dict(call)
                fn = dict(call.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
                call["function"] = fn
                calls.append(call)
            msg["tool_calls"] = calls
        out.append(msg)
    return out
