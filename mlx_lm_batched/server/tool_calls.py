"""Tool calls in Hermes/Qwen form: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Chat templates of Qwen 2.5/3, Hermes and many fine-tunes make the model emit such
blocks; the server turns them into OpenAI's ``tool_calls``. :func:`split_tool_calls`
parses a whole text; :class:`ToolCallStream` does it on streamed text, holding back a
block until it closes.
"""

import json
import uuid

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def _call(body, index):
    """OpenAI's tool call object for one block body (None when it is not valid JSON
    with a ``name``)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    return {"index": index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": data["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args)}}


def split_tool_calls(text):
    """``(content without valid blocks, [tool calls])``; a block that does not parse
    stays in the content as it was written."""
    content, calls, pos = "", [], 0
    while True:
        start = text.find(OPEN, pos)
        end = text.find(CLOSE, start + len(OPEN)) if start >= 0 else -1
        if start < 0 or end < 0:
            content += text[pos:]
            break
        call = _call(text[start + len(OPEN) : end].strip(), len(calls))
        if call is None:
            content += text[pos : end + len(CLOSE)]
        else:
            content += text[pos:start]
            calls.append(call)
        pos = end + len(CLOSE)
    return content, calls


class ToolCallStream:
    """Feed text deltas; get ``(content delta, [complete tool calls])`` per feed."""

    def __init__(self):
        self._buf = ""
        self.count = 0  # tool calls emitted so far

    def feed(self, text, final=False):
        """Process a delta; ``final`` flushes an unclosed block as plain content."""
        self._buf += text
        content, calls = "", []
        while True:
            start = self._buf.find(OPEN)
            if start < 0:
                keep = 0 if final else _partial_open(self._buf)
                content += self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep :]
                return content, calls
            end = self._buf.find(CLOSE, start)
            if end < 0:
                content += self._buf[:start]
                self._buf = self._buf[start:]
                if final:
                    content += self._buf
                    self._buf = ""
                return content, calls
            call = _call(self._buf[start + len(OPEN) : end].strip(), self.count)
            if call is None:
                content += self._buf[: end + len(CLOSE)]
            else:
                content += self._buf[:start]
                calls.append(call)
                self.count += 1
            self._buf = self._buf[end + len(CLOSE) :]


def _partial_open(text):
    """Length of the longest tail of ``text`` that starts ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:n]):
            return n
    return 0
