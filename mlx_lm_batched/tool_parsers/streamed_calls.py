"""A JSON tool call's arguments, streamed while the model writes them.

A ``json_tools`` call body (``{"name": "f", "arguments": {...}}``, the format forced
calls take) is read as it grows: once ``"name"`` and the ``"arguments"`` key are
complete the call opens (OpenAI's first tool-call delta: index, id, type, name), then
each piece of the arguments' JSON text is a fragment, passed on as written, up to the
end of the arguments value. The fragments join to the exact text the model wrote for
the arguments, so they parse to the same value as the whole call.
"""

import json
import re

from .calls import tool_call

# The head of a call body up to its arguments value (the name first, as forced calls
# and Hermes/Qwen templates write it).
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


class JsonValueEnd:
    """Where a JSON value that starts a text ends, read a piece at a time."""

    def __init__(self):
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.started = False
        self.done = False

    def take(self, text):
        """How many characters of ``text`` still belong to the value."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return self._end(i + 1)
                continue
            if not self.started and ch.isspace():
                continue
            if self.started and self.depth == 0 and (ch.isspace() or ch in ",}]"):
                return self._end(i)  # the end of a number or literal
            self.started = True
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return self._end(i + 1)
        return len(text)

    def _end(self, n):
        self.done = True
        return n


class JsonCallStream:
    """One call body fed as generated; :meth:`feed` returns OpenAI tool-call deltas."""

    def __init__(self, index):
        self.index = index
        self.opened = False  # the first delta (id, name) has been sent
        self._head = ""
        self._value = None

    def feed(self, text):
        """The deltas ``text`` completes: the opening one, then argument fragments."""
        out = []
        if not self.opened:
            self._head += text
            match = _HEAD.match(self._head)
            if match is None:
                return out
            try:
                name = json.loads(match.group(1))
            except ValueError:
                return out
            self.opened, self._value = True, JsonValueEnd()
            out.append(tool_call(name, "", self.index))
            text = self._head[match.end():]
        if self._value.done or not text:
            return out
        fresh = not self._value.started
        piece = text[: self._value.take(text)]
        if fresh:  # the whitespace between the key and the value is not the value's
            piece = piece.lstrip()
        if piece:
            out.append({"index": self.index, "function": {"arguments": piece}})
        return out
