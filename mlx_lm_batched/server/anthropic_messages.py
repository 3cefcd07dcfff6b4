"""``POST /v1/messages``: Anthropic's Messages API on the same engine as chat completions.

A request is translated to a chat-completion request (system, text blocks, ``tool_use``
as assistant tool calls, ``tool_result`` as tool messages, tools and ``tool_choice``),
checked by the same schema, and answered in Anthropic's shapes: a ``message`` with text
and ``tool_use`` blocks, or its stream events (``message_start``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``),
text as ``text_delta``s and a tool call's input as ``input_json_delta`` fragments while
they are generated.
"""

import json
import uuid

from starlette.responses import JSONResponse

from .events import Delta, Failed
from .errors import APIError
from .job_prep import JobSpec
from .job_stream import start_job
from .schema import ChatCompletionRequest, chat_messages, generation_params, parse
from .tool_calls import answer_family, answer_parser, split_tool_calls
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


def _blocks(text, family):
    content, calls = split_tool_calls(text, family)
    blocks = [{"type": "text", "text": content}] if content or not calls else []
    for c in calls:
        blocks.append({"type": "tool_use", "id": "toolu_" + c["id"][5:], "name": c["function"]["name"],
                       "input": json.loads(c["function"]["arguments"] or "{}")})
    return blocks, bool(calls)


async def serve_messages(engine, config, data, model_name, grammar_ready, request=None):
    """Answer one Messages request (a JSON response or an event stream); ``request``
    (the Starlette request) is polled so that a client gone cancels its job."""
    req = parse(ChatCompletionRequest, chat_request(data))
    params = generation_params(req, config, config.default_temperature)
    spec = JobSpec(params, messages=chat_messages(req),
                   tools=tools_for_prompt(req.tools, req.tool_choice),
                   adapter=config.adapter_slot(model_name), tool_format=config.tool_format)
    family = answer_family(spec.tools, req.tool_choice, config.tool_format)
    await grammar_ready(params)
    job = await start_job(engine, spec, request)
    msg_id = f"msg_{uuid.uuid4().hex[:24]}"
    head = {"id": msg_id, "type": "message", "role": "assistant", "model": model_name,
            "stop_sequence": None}
    if params.stream:
        return job.sse_response(_events(job, head, family))
    result = await job.collect()
    blocks, called = _blocks(result.texts[0], family)
    reason = result.finish_reasons[0]
    return JSONResponse({**head, "content": blocks,
                         "stop_reason": "tool_use" if called else _STOP.get(reason, reason),
                         "usage": {"input_tokens": job.started.prompt_tokens,
                                   "output_tokens": result.completion_tokens}})


def _sse(kind, data):
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


class _Blocks:
    """The content blocks of a streamed message, opened as the parsed output needs them."""

    def __init__(self):
        self.index, self.kind = -1, None

    def write(self, parsed):
        """The events of one parser result (text, tool-call openings and fragments)."""
        if parsed["content"]:
            if self.kind != "text":
                yield from self._open({"type": "text", "text": ""})
            yield _sse("content_block_delta", {"index": self.index, "delta": {
                "type": "text_delta", "text": parsed["content"]}})
        for call in parsed["tool_calls"]:
            if "id" in call:
                yield from self._open({"type": "tool_use", "id": "toolu_" + call["id"][5:],
                                       "name": call["function"]["name"], "input": {}})
            if call["function"]["arguments"]:
                yield _sse("content_block_delta", {"index": self.index, "delta": {
                    "type": "input_json_delta", "partial_json": call["function"]["arguments"]}})

    def close(self):
        """The last block's end (an empty text block when nothing was generated)."""
        if self.kind is None:
            yield from self._open({"type": "text", "text": ""})
        yield _sse("content_block_stop", {"index": self.index})

    def _open(self, block):
        if self.kind is not None:
            yield _sse("content_block_stop", {"index": self.index})
        self.index, self.kind = self.index + 1, block["type"]
        yield _sse("content_block_start", {"index": self.index, "content_block": block})


async def _events(job, head, family):
    """The message's events; text and tool calls stream as they are generated."""
    yield _sse("message_start", {"message": {**head, "content": [], "stop_reason": None,
                                             "usage": {"input_tokens": job.started.prompt_tokens,
                                                       "output_tokens": 0}}})
    parser, blocks = answer_parser(family), _Blocks()
    reason, out = None, 0
    async for ev in job.events():
        if isinstance(ev, Failed):
            yield _sse("error", {"error": {"type": "api_error", "message": ev.error.message}})
            return
        if isinstance(ev, Delta):
            parsed = parser.feed(ev.text)
        else:
            reason, out, parsed = ev.finish_reason, ev.completion_tokens, parser.finish()
        for event in blocks.write(parsed):
            yield event
    for event in blocks.close():
        yield event
    yield _sse("message_delta", {"delta": {"stop_reason": "tool_use" if parser.count else
                                           _STOP.get(reason, reason), "stop_sequence": None},
                                 "usage": {"output_tokens": out}})
    yield _sse("message_stop", {})
