"""``POST /v1/messages``: Anthropic's Messages API on the same engine as chat completions.

A request is translated to a chat-completion request (system, text blocks, ``tool_use``
as assistant tool calls, ``tool_result`` as tool messages, tools and ``tool_choice``),
checked by the same schema, and answered in Anthropic's shapes: a ``message`` with text
and ``tool_use`` blocks, or its stream events (``message_start``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``).
"""

import asyncio
import json
import uuid

from starlette.responses import JSONResponse, StreamingResponse

from .collect import collect_text
from .events import Delta, Failed, Finished
from .errors import APIError
from .job_prep import JobSpec
from .schema import ChatCompletionRequest, chat_messages, generation_params, parse
from .tool_calls import split_tool_calls
from .tool_choice import tools_for_prompt

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "stream")


def _text(content):
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


def _messages(data):
    out = []
    if data.get("system"):
        out.append({"role": "system", "content": _text(data["system"])})
    for m in data.get("messages") or []:
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        calls = [{"id": b["id"], "type": "function", "function": {
            "name": b["name"], "arguments": json.dumps(b.get("input", {}))}}
            for b in blocks if b.get("type") == "tool_use"]
        for b in blocks:
            if b.get("type") == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                            "content": _text(b.get("content"))})
        text = _text(blocks)
        if text or calls or not any(b.get("type") == "tool_result" for b in blocks):
            msg = {"role": m.get("role"), "content": text}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _tool_choice(choice):
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else choice
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"any": "required", "auto": "auto", "none": "none"}.get(kind, choice)


def chat_request(data):
    """The chat-completion request body of an Anthropic Messages body."""
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", None, "invalid_body")
    if "max_tokens" not in data:
        raise APIError(400, "Missing required parameter: 'max_tokens'.", "max_tokens",
                       "missing_required_parameter")
    body = {k: data[k] for k in _SAMPLING if k in data}
    body["messages"] = _messages(data)
    if data.get("stop_sequences"):
        body["stop"] = data["stop_sequences"]
    if data.get("tools"):
        body["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description", ""),
            "parameters": t.get("input_schema") or {"type": "object"}}} for t in data["tools"]]
    if data.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(data["tool_choice"])
        if isinstance(data["tool_choice"], dict) and data["tool_choice"].get("disable_parallel_tool_use"):
            body["parallel_tool_calls"] = False
    return body


def _blocks(text, tools):
    content, calls = split_tool_calls(text) if tools else (text, [])
    blocks = [{"type": "text", "text": content}] if content or not calls else []
    for c in calls:
        blocks.append({"type": "tool_use", "id": "toolu_" + c["id"][5:], "name": c["function"]["name"],
                       "input": json.loads(c["function"]["arguments"] or "{}")})
    return blocks, bool(calls)


async def serve_messages(engine, config, data, model_name, grammar_ready):
    """Answer one Messages request (a JSON response or an event stream)."""
    req = parse(ChatCompletionRequest, chat_request(data))
    params = generation_params(req, config, config.default_temperature)
    spec = JobSpec(params, messages=chat_messages(req),
                   tools=tools_for_prompt(req.tools, req.tool_choice),
                   adapter=config.adapter_slot(model_name), tool_format=config.tool_format)
    await grammar_ready(params)
    events = asyncio.Queue()
    job = engine.submit(spec, asyncio.get_running_loop(), events)
    first = await events.get()
    if isinstance(first, Failed):
        raise first.error
    msg_id = f"msg_{uuid.uuid4().hex[:24]}"
    head = {"id": msg_id, "type": "message", "role": "assistant", "model": model_name,
            "stop_sequence": None}
    if params.stream:
        return StreamingResponse(_events(engine, job, events, head, first, spec),
                                 media_type="text/event-stream")
    text, reason, out = await collect_text(engine, job, events)
    blocks, called = _blocks(text, spec.tools)
    return JSONResponse({**head, "content": blocks,
                         "stop_reason": "tool_use" if called else _STOP.get(reason, reason),
                         "usage": {"input_tokens": first.prompt_tokens, "output_tokens": out}})


def _sse(kind, data):
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


async def _events(engine, job, events, head, started, spec):
    """Text streams as ``text_delta``s; tool calls (with tools) come whole at the end."""
    done = False
    try:
        yield _sse("message_start", {"message": {**head, "content": [], "stop_reason": None,
                                                 "usage": {"input_tokens": started.prompt_tokens,
                                                           "output_tokens": 0}}})
        yield _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        text, reason, out = "", None, 0
        while reason is None:
            ev = await events.get()
            if isinstance(ev, Failed):
                yield _sse("error", {"error": {"type": "api_error", "message": ev.error.message}})
                return
            if isinstance(ev, Delta):
                text += ev.text
                if ev.text and not spec.tools:
                    yield _sse("content_block_delta", {"index": 0, "delta": {
                        "type": "text_delta", "text": ev.text}})
            elif isinstance(ev, Finished):
                reason, out = ev.finish_reason, ev.completion_tokens
        blocks, called = _blocks(text, spec.tools)
        if spec.tools and blocks and blocks[0]["type"] == "text":
            yield _sse("content_block_delta", {"index": 0, "delta": {
                "type": "text_delta", "text": blocks[0]["text"]}})
        yield _sse("content_block_stop", {"index": 0})
        for i, b in enumerate(x for x in blocks if x["type"] == "tool_use"):
            yield _sse("content_block_start", {"index": i + 1, "content_block": {**b, "input": {}}})
            yield _sse("content_block_delta", {"index": i + 1, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(b["input"])}})
            yield _sse("content_block_stop", {"index": i + 1})
        yield _sse("message_delta", {"delta": {"stop_reason": "tool_use" if called else
                                               _STOP.get(reason, reason), "stop_sequence": None},
                                     "usage": {"output_tokens": out}})
        yield _sse("message_stop", {})
        done = True
    finally:
        if not done:
            engine.cancel(job)
