"""OpenAI tool-call objects, and the parsing helpers the families share."""

import json
import uuid


def tool_call(name, arguments, index):
    """OpenAI's ``tool_calls`` entry (``index`` is kept for streamed deltas)."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"index": index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def json_value(text):
    """``text`` as JSON when it parses, else the stripped text itself (a string argument)."""
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()


def named_call(data):
    """``(name, arguments)`` of ``{"name": ..., "arguments"|"parameters": ...}``."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ValueError("a tool call needs a string 'name'")
    return data["name"], data.get("arguments", data.get("parameters", {}))


def load_json(text):
    """``json.loads`` whose error is a ValueError naming the text."""
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"not JSON: {text[:80]!r}") from None
