"""Tool calls whose arguments are JSON text, streamed while the model writes them.

A call opens (OpenAI's first tool-call delta: index, id, type, name) once its name is
complete; then each piece of the arguments' JSON text is a fragment, passed on as
written, up to the end of the arguments value. The fragments join to the exact text the
model wrote for the arguments, so they parse to the same value as the whole call.

- ``json_tools``: ``{"name": "f", "arguments": {...}}`` (the format forced calls take);
- ``mistral``: ``f[ARGS]{...}`` / ``f[CALL_ID]id[ARGS]{...}``, or a JSON list of calls;
- ``kimi_k2``: ``<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{...}
  <|tool_call_end|>``, several in one section.

Every stream has the same interface (:class:`CallStream`): ``feed(text)`` and
``close()`` return deltas, ``opened`` counts the calls opened so far.
"""

import json
import re

from .calls import load_json, named_call, tool_call

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


class RawJson:
    """The text of one JSON value as it is written, without the whitespace before it."""

    def __init__(self):
        self.end = JsonValueEnd()

    def take(self, text):
        """The part of ``text`` that belongs to the value ("" once it has ended)."""
        if self.end.done:
            return ""
        fresh = not self.end.started
        piece = text[: self.end.take(text)]
        return piece.lstrip() if fresh else piece


class CallStream:
    """The calls of one tool-call block, fed as generated. ``index``: the first call's
    index in the response; subclasses implement :meth:`feed` (and :meth:`close` when a
    call can be left open at the end of the block)."""

    def __init__(self, index):
        self.index = index
        self.opened = 0  # calls whose first delta (id, name) has been sent

    def feed(self, text):
        """The deltas ``text`` completes."""
        raise NotImplementedError

    def close(self):
        """The deltas that end the block (what an unclosed call still needs)."""
        return []

    def _open(self, name):
        self.opened += 1
        return tool_call(name, "", self.index + self.opened - 1)

    def _fragment(self, text):
        return {"index": self.index + self.opened - 1, "function": {"arguments": text}}


def held_back(text, marker):
    """Length of the longest tail of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class JsonCallStream(CallStream):
    """A ``json_tools`` body: ``{"name": "f", "arguments": ...}``."""

    def __init__(self, index):
        super().__init__(index)
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
            self._value = RawJson()
            out.append(self._open(name))
            text = self._head[match.end():]
        piece = self._value.take(text)
        if piece:
            out.append(self._fragment(piece))
        return out


class JsonListCallStream(CallStream):
    """``[{"name": ..., "arguments": ...}, ...]`` (or one such object): each element
    streamed as a ``json_tools`` body; one written otherwise (``"parameters"``, the
    arguments before the name) is sent whole when it ends."""

    def __init__(self, index):
        super().__init__(index)
        self._element = None  # (JsonCallStream, JsonValueEnd, text) of the open element

    def feed(self, text):
        """The deltas ``text`` completes, element after element."""
        out = []
        while text:
            if self._element is None:
                start = text.find("{")
                if start < 0:
                    return out  # separators: whitespace, '[', ',', ']'
                self._element = (JsonCallStream(self.index + self.opened), JsonValueEnd(), "")
                text = text[start:]
            call, end, seen = self._element
            n = end.take(text)
            piece, text = text[:n], text[n:]
            before = call.opened
            out += call.feed(piece)
            self.opened += call.opened - before
            self._element = (call, end, seen + piece)
            if end.done:
                self._element = None
                if not call.opened:
                    out += self._whole(seen + piece)
        return out

    def _whole(self, text):
        try:
            name, arguments = named_call(load_json(text))
        except ValueError:
            return []  # not a call: nothing to send for it
        self.opened += 1
        return [tool_call(name, arguments, self.index + self.opened - 1)]


class MistralCallStream(CallStream):
    """A ``mistral`` body: ``f[ARGS]{...}``, ``f[CALL_ID]id[ARGS]{...}``, or a JSON list
    of calls (older templates; streamed as :class:`JsonListCallStream`)."""

    def __init__(self, index):
        super().__init__(index)
        self._head = ""
        self._value = None
        self._list = None

    def feed(self, text):
        """The deltas ``text`` completes."""
        if self._list is not None:
            return self._list_feed(text)
        out = []
        if self._value is None:
            self._head += text
            start = self._head.lstrip()[:1]
            if start in ("[", "{"):
                self._list, text = JsonListCallStream(self.index), self._head
                return self._list_feed(text)
            head, found, text = self._head.partition("[ARGS]")
            name = head.partition("[CALL_ID]")[0].strip()
            if not found or not name:
                return out
            self._value = RawJson()
            out.append(self._open(name))
        piece = self._value.take(text)
        if piece:
            out.append(self._fragment(piece))
        return out

    def _list_feed(self, text):
        out = self._list.feed(text)
        self.opened = self._list.opened
        return out


_KIMI_OPEN = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>", re.DOTALL)
_KIMI_END = "<|tool_call_end|>"


def kimi_name(ident):
    """``functions.f:0`` -> ``f``."""
    name = ident.strip().split(":")[0]
    return name[len("functions."):] if name.startswith("functions.") else name


class KimiCallStream(CallStream):
    """A ``kimi_k2`` section: its calls one after the other, each one's JSON arguments
    streamed up to its ``<|tool_call_end|>``."""

    def __init__(self, index):
        super().__init__(index)
        self._buf = ""
        self._value = None  # RawJson of the open call's arguments

    def feed(self, text):
        """The deltas ``text`` completes."""
        out = []
        self._buf += text
        while True:
            if self._value is None:
                match = _KIMI_OPEN.search(self._buf)
                if match is None:
                    return out
                out.append(self._open(kimi_name(match.group(1))))
                self._buf, self._value = self._buf[match.end():], RawJson()
            end = self._buf.find(_KIMI_END)
            ready = len(self._buf) - held_back(self._buf, _KIMI_END) if end < 0 else end
            piece = self._value.take(self._buf[:ready])
            if piece:
                out.append(self._fragment(piece))
            if end < 0:
                self._buf = self._buf[ready:]
                return out
            self._buf, self._value = self._buf[end + len(_KIMI_END):], None
