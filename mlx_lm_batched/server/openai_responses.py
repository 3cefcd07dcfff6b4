"""``POST /v1/responses``: OpenAI's Responses API, stateless, on the chat-completion engine.

``input`` (text or items: messages, ``function_call``, ``function_call_output``),
``instructions``, function ``tools`` and ``tool_choice``, ``text.format`` (structured
output), ``max_output_tokens``, ``stream`` (the Responses event types). Responses are
not stored, so ``previous_response_id`` is a 400 saying so.
"""

import json
import time
import uuid

from starlette.responses import JSONResponse

from .events import Delta, Failed
from .errors import APIError
from .job_prep import JobSpec
from .job_stream import start_job
from .schema import ChatCompletionRequest, chat_messages, generation_params, parse
from .tool_calls import answer_family, answer_parser, split_tool_calls
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


def _output(text, family):
    content, calls = split_tool_calls(text, family)
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


async def serve_responses(engine, config, data, model_name, grammar_ready, request=None):
    """Answer one Responses request (a JSON response or an event stream); ``request``
    (the Starlette request) is polled so that a client gone cancels its job."""
    req = parse(ChatCompletionRequest, chat_request(data))
    params = generation_params(req, config, config.default_temperature)
    spec = JobSpec(params, messages=chat_messages(req),
                   tools=tools_for_prompt(req.tools, req.tool_choice),
                   adapter=config.adapter_slot(model_name), tool_format=config.tool_format)
    family = answer_family(spec.tools, req.tool_choice, config.tool_format)
    await grammar_ready(params)
    job = await start_job(engine, spec, request)
    head = {"id": f"resp_{uuid.uuid4().hex[:24]}", "object": "response",
            "created_at": int(time.time()), "model": model_name, "error": None,
            "instructions": data.get("instructions"), "tools": data.get("tools") or [],
            "tool_choice": data.get("tool_choice") or "auto", "parallel_tool_calls": req.parallel_tool_calls,
            "temperature": data.get("temperature"), "top_p": data.get("top_p")}
    if params.stream:
        return job.sse_response(_events(job, head, family))
    result = await job.collect()
    return JSONResponse(_response(head, _output(result.texts[0], family),
                                  result.finish_reasons[0], job.started.prompt_tokens,
                                  result.completion_tokens))


class _Items:
    """The output items of a streamed response, opened as the parsed output needs them:
    a message (``response.output_text.delta``) or a function call
    (``response.function_call_arguments.delta``). ``sse(kind, data)`` writes an event."""

    def __init__(self, sse):
        self.sse, self.items, self.open = sse, [], None

    def write(self, parsed):
        """The events of one parser result (text, tool-call openings and fragments)."""
        if parsed["content"]:
            if self.open is None or self.open["type"] != "message":
                yield from self._open_message()
            self.open["content"][0]["text"] += parsed["content"]
            yield self.sse("response.output_text.delta", {**self._where(), "content_index": 0,
                                                          "delta": parsed["content"],
                                                          "logprobs": []})
        for call in parsed["tool_calls"]:
            if "id" in call:
                yield from self._close()
                self._add({"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}",
                           "call_id": call["id"], "name": call["function"]["name"],
                           "arguments": "", "status": "in_progress"})
                yield self.sse("response.output_item.added", {"output_index": len(self.items) - 1,
                                                              "item": dict(self.open)})
            if call["function"]["arguments"]:
                self.open["arguments"] += call["function"]["arguments"]
                yield self.sse("response.function_call_arguments.delta", {
                    **self._where(), "delta": call["function"]["arguments"]})

    def finish(self):
        """The last item's end (an empty message when nothing was generated)."""
        if not self.items:
            yield from self._open_message()
        yield from self._close()

    def _where(self):
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}

    def _add(self, item):
        self.items.append(item)
        self.open = item

    def _open_message(self):
        yield from self._close()
        self._add({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": "in_progress",
                   "role": "assistant", "content": []})
        yield self.sse("response.output_item.added", {"output_index": len(self.items) - 1,
                                                      "item": {**self.open, "content": []}})
        part = {"type": "output_text", "text": "", "annotations": []}
        self.open["content"].append(part)
        yield self.sse("response.content_part.added", {**self._where(), "content_index": 0,
                                                       "part": dict(part)})

    def _close(self):
        item, where = self.open, self._where() if self.open is not None else None
        if item is None:
            return
        self.open = None
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            yield self.sse("response.output_text.done", {**where, "content_index": 0,
                                                         "text": part["text"], "logprobs": []})
            yield self.sse("response.content_part.done", {**where, "content_index": 0,
                                                          "part": part})
        else:
            yield self.sse("response.function_call_arguments.done", {
                **where, "arguments": item["arguments"]})
        yield self.sse("response.output_item.done", {"output_index": where["output_index"],
                                                     "item": item})


async def _events(job, head, family):
    """The Responses stream: ``response.created``, the output items as they are generated
    (text deltas, function-call argument deltas), then ``response.completed``."""
    seq = iter(range(1 << 62))

    def sse(kind, data):
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **data})}\n\n"

    pending = {**head, "status": "in_progress", "output": [], "usage": None,
               "incomplete_details": None}
    yield sse("response.created", {"response": pending})
    parser, items = answer_parser(family), _Items(sse)
    reason, out = None, 0
    async for ev in job.events():
        if isinstance(ev, Failed):
            yield sse("error", {"code": ev.error.code, "message": ev.error.message,
                                "param": ev.error.param})
            return
        if isinstance(ev, Delta):
            parsed = parser.feed(ev.text)
        else:
            reason, out, parsed = ev.finish_reason, ev.completion_tokens, parser.finish()
        for event in items.write(parsed):
            yield event
    for event in items.finish():
        yield event
    yield sse("response.completed", {"response": _response(head, items.items, reason,
                                                           job.started.prompt_tokens, out)})
