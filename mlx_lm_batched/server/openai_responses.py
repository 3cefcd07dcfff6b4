"""``POST /v1/responses``: OpenAI's Responses API, stateless, on the chat-completion engine.

``input`` (text or items: messages, ``function_call``, ``function_call_output``),
``instructions``, function ``tools`` and ``tool_choice``, ``text.format`` (structured
output), ``max_output_tokens``, ``stream`` (the Responses event types). Responses are
not stored, so ``previous_response_id`` is a 400 saying so.
"""

import asyncio
import json
import time
import uuid

from starlette.responses import JSONResponse, StreamingResponse

from .collect import collect_text
from .events import Delta, Failed, Finished
from .errors import APIError
from .job_prep import JobSpec
from .schema import ChatCompletionRequest, chat_messages, generation_params, parse
from .tool_calls import split_tool_calls
from .tool_choice import tools_for_prompt


def _text(content):
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or []
                   if p.get("type") in ("input_text", "output_text", "text"))


def _messages(data):
    out = [{"role": "system", "content": data["instructions"]}] if data.get("instructions") else []
    items = data.get("input")
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            out.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": item.get("output") if isinstance(item.get("output"), str)
                        else json.dumps(item.get("output"))})
        else:
            raise APIError(400, f"Invalid value for 'input': item type {kind!r} is not supported.",
                           "input", "invalid_value")
    return out


def chat_request(data):
    """The chat-completion request body of a Responses body; APIError(400)."""
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", None, "invalid_body")
    if data.get("previous_response_id") is not None:
        raise APIError(400, "This server does not store responses: send the whole "
                       "conversation in 'input' instead of 'previous_response_id'.",
                       "previous_response_id", "unsupported_parameter")
    if data.get("input") is None:
        raise APIError(400, "Missing required parameter: 'input'.", "input",
                       "missing_required_parameter")
    body = {k: data[k] for k in ("temperature", "top_p", "stream") if k in data}
    body["messages"] = _messages(data)
    if data.get("max_output_tokens") is not None:
        body["max_tokens"] = data["max_output_tokens"]
    fmt = (data.get("text") or {}).get("format")
    if fmt is not None:
        inner = {k: v for k, v in fmt.items() if k != "type"}
        body["response_format"] = ({"type": "json_schema", "json_schema": inner}
                                   if fmt.get("type") == "json_schema" else {"type": fmt.get("type")})
    tools = data.get("tools") or []
    bad = next((t.get("type") for t in tools if t.get("type") != "function"), None)
    if bad is not None:
        raise APIError(400, f"Invalid value for 'tools': tool type {bad!r} is not supported "
                       "(only 'function').", "tools", "invalid_value")
    if tools:
        body["tools"] = [{"type": "function", "function": {
            k: t[k] for k in ("name", "description", "parameters") if k in t}} for t in tools]
    choice = data.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        body["tool_choice"] = choice
    if data.get("parallel_tool_calls") is not None:
        body["parallel_tool_calls"] = data["parallel_tool_calls"]
    return body


def _output(text, tools):
    content, calls = split_tool_calls(text) if tools else (text, [])
    items = []
    if content or not calls:
        items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": "completed",
                      "role": "assistant",
                      "content": [{"type": "output_text", "text": content, "annotations": []}]})
    for c in calls:
        items.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}",
                      "call_id": c["id"], "name": c["function"]["name"],
                      "arguments": c["function"]["arguments"], "status": "completed"})
    return items


def _response(head, items, reason, prompt_tokens, out_tokens):
    cut = reason == "length"
    return {**head, "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "output": items, "usage": {
                "input_tokens": prompt_tokens, "output_tokens": out_tokens,
                "total_tokens": prompt_tokens + out_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0}}}


async def serve_responses(engine, config, data, model_name, grammar_ready):
    """Answer one Responses request (a JSON response or an event stream)."""
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
    head = {"id": f"resp_{uuid.uuid4().hex[:24]}", "object": "response",
            "created_at": int(time.time()), "model": model_name, "error": None,
            "instructions": data.get("instructions"), "tools": data.get("tools") or [],
            "tool_choice": data.get("tool_choice") or "auto", "parallel_tool_calls": req.parallel_tool_calls,
            "temperature": data.get("temperature"), "top_p": data.get("top_p")}
    if params.stream:
        return StreamingResponse(_events(engine, job, events, head, first, spec),
                                 media_type="text/event-stream")
    text, reason, out = await collect_text(engine, job, events)
    return JSONResponse(_response(head, _output(text, spec.tools), reason, first.prompt_tokens, out))


async def _events(engine, job, events, head, started, spec):
    """The Responses stream: text as ``response.output_text.delta`` events (with tools,
    the items come whole at the end), then ``response.completed``."""
    seq = iter(range(1 << 62))

    def sse(kind, data):
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **data})}\n\n"

    done = False
    try:
        pending = {**head, "status": "in_progress", "output": [], "usage": None,
                   "incomplete_details": None}
        yield sse("response.created", {"response": pending})
        msg_id = f"msg_{uuid.uuid4().hex[:24]}"
        live = not spec.tools
        if live:
            yield sse("response.output_item.added", {"output_index": 0, "item": {
                "type": "message", "id": msg_id, "status": "in_progress", "role": "assistant",
                "content": []}})
            yield sse("response.content_part.added", {"item_id": msg_id, "output_index": 0,
                                                      "content_index": 0, "part": {
                "type": "output_text", "text": "", "annotations": []}})
        text, reason, out = "", None, 0
        while reason is None:
            ev = await events.get()
            if isinstance(ev, Failed):
                yield sse("error", {"code": ev.error.code, "message": ev.error.message,
                                    "param": ev.error.param})
                return
            if isinstance(ev, Delta):
                text += ev.text
                if live and ev.text:
                    yield sse("response.output_text.delta", {"item_id": msg_id, "output_index": 0,
                                                             "content_index": 0, "delta": ev.text,
                                                             "logprobs": []})
            elif isinstance(ev, Finished):
                reason, out = ev.finish_reason, ev.completion_tokens
        items = _output(text, spec.tools)
        if live:
            items[0]["id"] = msg_id
            yield sse("response.output_text.done", {"item_id": msg_id, "output_index": 0,
                                                    "content_index": 0, "text": text,
                                                    "logprobs": []})
            yield sse("response.content_part.done", {"item_id": msg_id, "output_index": 0,
                                                     "content_index": 0,
                                                     "part": items[0]["content"][0]})
            yield sse("response.output_item.done", {"output_index": 0, "item": items[0]})
        else:
            for i, item in enumerate(items):
                yield sse("response.output_item.added", {"output_index": i, "item": item})
                yield sse("response.output_item.done", {"output_index": i, "item": item})
        yield sse("response.completed", {"response": _response(head, items, reason,
                                                               started.prompt_tokens, out)})
        done = True
    finally:
        if not done:
            engine.cancel(job)
