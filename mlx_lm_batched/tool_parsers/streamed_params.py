"""Tool calls whose arguments are not JSON text, streamed a parameter at a time.

``qwen3_coder`` (``<parameter=a>``), ``glm47`` and ``longcat`` (key/value tags),
``minimax_m2`` (``<parameter name="a">``), ``gemma4`` and ``function_gemma``
(``call:f{a:...}``) and ``pythonic`` (``f(a=...)``) write each argument in their own
syntax, so the JSON of the arguments is built as the call is read: ``{`` when the call
opens (its first delta: id and name), ``"key": value`` as each parameter completes
(each value read as the whole-call parser reads it), ``}`` at the call's end, or at the
end of the block when the call was cut off. The fragments join to JSON that parses to
the arguments of the whole call.
"""

import ast
import json
import re

from .call_syntax_families import braced_to_json
from .calls import json_value
from .markup_families import (
    GLM_PAIR,
    LONGCAT_PAIR,
    MINIMAX_PARAM,
    QWEN_PARAM,
    named_pairs_head,
    qwen_value,
)
from .streamed_calls import CallStream, JsonCallStream


class _ArgumentsStream(CallStream):
    """What the per-parameter streams share: a call opens with ``{``, each parameter is
    ``"key": value`` after a comma, the call closes with ``}``."""

    def __init__(self, index):
        super().__init__(index)
        self._buf = ""  # the block's text not consumed yet (the open call's inner text)
        self._in_call = False
        self._sent = 0  # parameters sent of the open call

    def _open_call(self, name):
        self._in_call, self._sent = True, 0
        return [self._open(name), self._fragment("{")]

    def _close_call(self):
        self._in_call = False
        return [self._fragment("}")]

    def _send(self, pairs):
        out = []
        for key, value in pairs:
            sep = ", " if self._sent else ""
            self._sent += 1
            out.append(self._fragment(f"{sep}{json.dumps(key, ensure_ascii=False)}: "
                                      f"{json.dumps(value, ensure_ascii=False)}"))
        return out


class ParamCallStream(_ArgumentsStream):
    """Calls written parameter by parameter in tags: subclasses say where a call opens
    (:meth:`_find_open`), where it closes (:meth:`_find_close`), which of its parameters
    are complete (:meth:`_params`), how a value reads (:meth:`_value`) and which strings
    can complete a parameter or the call (``ENDS``: until one is generated, a feed only
    appends, so a long value costs no rescans)."""

    ENDS: tuple

    def __init__(self, index):
        super().__init__(index)
        self._from = 0  # where the parameters not sent yet start in the open call's text
        self._checked = 0  # how much of the open call's text was looked at for ENDS

    def feed(self, text):
        """The deltas ``text`` completes."""
        self._buf += text
        out = []
        if self._in_call and not self._may_end():
            return out
        while True:
            if not self._in_call:
                found = self._find_open(self._buf)
                if found is None:
                    return out
                name, end = found
                out += self._open_call(name)
                self._buf, self._from = self._buf[end:], 0
            close = self._find_close(self._buf)
            inner = self._buf if close is None else self._buf[:close[0]]
            out += self._send_new(inner, close is not None)
            if close is None:
                self._checked = len(self._buf)
                return out
            out += self._close_call()
            self._buf = self._buf[close[1]:]

    def close(self):
        """The parameters and ``}`` of a call the end of the block cut off."""
        if not self._in_call:
            return []
        return self._send_new(self._buf, True) + self._close_call()

    def _may_end(self):
        start = max(self._checked - max(map(len, self.ENDS)) + 1, 0)
        self._checked = len(self._buf)
        return any(self._buf.find(end, start) >= 0 for end in self.ENDS)

    def _send_new(self, inner, closed):
        """Send the complete parameters after ``_from`` (values read only then)."""
        params = self._params(inner[self._from:], closed)
        if params:
            self._from += params[-1][2]
        return self._send([(key, self._value(raw)) for key, raw, _ in params])

    def _find_open(self, text):
        """``(name, where its arguments start)`` of the next call in ``text``, or None."""
        raise NotImplementedError

    def _find_close(self, inner):
        """``(start, end)`` of the open call's end marker in ``inner``, or None."""
        return None

    def _params(self, text, closed):
        """``(key, raw value, end offset)`` of the complete parameters that start
        ``text`` (all of them when ``closed``)."""
        raise NotImplementedError

    def _value(self, raw):
        """A parameter's value as the whole-call parser reads it."""
        return json_value(raw)


class _MarkedCallStream(ParamCallStream):
    """Calls between an opening tag that names the function and a closing tag."""

    OPEN: re.Pattern
    CLOSE: str

    def _find_open(self, text):
        match = self.OPEN.search(text)
        return None if match is None else (match.group(1).strip(), match.end())

    def _find_close(self, inner):
        at = inner.find(self.CLOSE)
        return None if at < 0 else (at, at + len(self.CLOSE))


class QwenCoderCallStream(_MarkedCallStream):
    """``<function=f>\\n<parameter=a>\\nvalue\\n</parameter>\\n</function>``; a parameter
    is complete at ``</parameter>`` or at the next ``<parameter=``."""

    OPEN, CLOSE = re.compile(r"<function=([^>\n]+)>"), "</function>"
    ENDS = ("</parameter>", "<parameter=", "</function>")

    def _params(self, text, closed):
        out = []
        for m in QWEN_PARAM.finditer(text):
            if not (closed or m.group(0).endswith("</parameter>")
                    or text.startswith("<parameter=", m.end())):
                break  # still being written (ended only by the end of the text so far)
            out.append((m.group(1).strip(), m.group(2), m.end()))
        return out

    def _value(self, raw):
        return qwen_value(raw)


class MinimaxCallStream(_MarkedCallStream):
    """``<invoke name="f"><parameter name="a">value</parameter></invoke>``."""

    OPEN, CLOSE = re.compile(r'<invoke name="([^"]+)">'), "</invoke>"
    ENDS = ("</parameter>", "</invoke>")

    def _params(self, text, closed):
        return [(m.group(1), m.group(2), m.end()) for m in MINIMAX_PARAM.finditer(text)]

    def _value(self, raw):
        return json_value(raw.strip("\n"))


class PairCallStream(ParamCallStream):
    """``f<arg_key>a</arg_key><arg_value>v</arg_value>...`` (``glm47``; ``longcat``
    with its own tag names): one call per block, named by the text before the first key."""

    def __init__(self, index, tag, pairs):
        super().__init__(index)
        self._tag, self._pairs = tag, pairs
        self.ENDS = (f"</{tag}_value>",)

    def _find_open(self, text):
        if self.opened:
            return None
        try:
            name = named_pairs_head(text, self._tag)
        except ValueError:
            return None
        at = text.find(f"<{self._tag}_key>")
        return None if at < 0 else (name, at)

    def _params(self, text, closed):
        return [(m.group(1).strip(), m.group(2), m.end()) for m in self._pairs.finditer(text)]


def glm_stream(index):
    """The ``glm47`` stream."""
    return PairCallStream(index, "arg", GLM_PAIR)


class LongcatCallStream(CallStream):
    """A ``longcat`` body: JSON (``{"name": ...}``) or key/value tags, told apart by its
    first character as the whole parser tells them."""

    def __init__(self, index):
        super().__init__(index)
        self._head, self._inner = "", None

    def feed(self, text):
        """The deltas ``text`` completes."""
        if self._inner is None:
            self._head += text
            if not self._head.strip():
                return []
            self._inner = (JsonCallStream(self.index) if self._head.lstrip().startswith("{")
                           else PairCallStream(self.index, "longcat_arg", LONGCAT_PAIR))
            text = self._head
        out = self._inner.feed(text)
        self.opened = self._inner.opened
        return out

    def close(self):
        """What the chosen format's stream still needs."""
        return [] if self._inner is None else self._inner.close()


class _ScannedCallStream(_ArgumentsStream):
    """Calls whose parameters are separated by commas outside strings and brackets,
    read a character at a time (the position, depth and string state are kept between
    feeds). Subclasses give ``OPEN`` (the call's head up to its arguments), ``END`` (the
    character closing them), ``QUOTES`` (string delimiters), ``ESCAPES`` (backslashes
    escape in strings), ``SEVERAL`` (more than one call per block), ``ASSIGN`` (between
    a key and its value) and :meth:`_read` (a parameter's text -> its pairs)."""

    def __init__(self, index):
        super().__init__(index)
        self._pos = self._chunk = self._depth = 0  # scan position, parameter start, nesting
        self._string = None  # the delimiter of the string being read

    def feed(self, text):
        """The deltas ``text`` completes."""
        self._buf += text
        out = []
        while True:
            if not self._in_call:
                match = self.OPEN.match(self._buf)
                if match is None or (self.opened and not self.SEVERAL):
                    return out
                out += self._open_call(match.group(1))
                self._buf = self._buf[match.end():]
                self._pos = self._chunk = self._depth = 0
                self._string = None
            if not self._scan(out):
                return out

    def close(self):
        """``}`` for a call cut off (the parameter being written is left out: the whole
        parse reads no call without its closing character)."""
        return self._close_call() if self._in_call else []

    def _scan(self, out):
        """Read on from ``_pos``, adding the deltas of what completes to ``out``; True
        when the call's closing character was read."""
        buf = self._buf
        while self._pos < len(buf):
            i = self._pos
            delim = self._delimiter_at(buf, i)
            if delim == "":
                return False  # a delimiter still being written
            if delim is not None:
                self._string = None if self._string == delim else delim
                self._pos += len(delim)
                continue
            ch = buf[i]
            self._pos += 1
            if self._string is not None:
                if ch == "\\" and self.ESCAPES:
                    self._pos += 1  # the escaped character (maybe not generated yet)
                continue
            if ch in "([{":
                self._depth += 1
            elif ch in ")]}" and self._depth:
                self._depth -= 1
            elif ch == self.END:
                out += self._param(buf[self._chunk:i]) + self._close_call()
                self._buf = buf[i + 1:]
                return True
            elif ch == "," and not self._depth:
                out += self._param(buf[self._chunk:i])
                self._chunk = i + 1
        return False

    def _delimiter_at(self, buf, i):
        """The string delimiter at ``buf[i]`` (None: none; "": maybe, not all written)."""
        for q in self.QUOTES:
            if self._string not in (None, q):
                continue
            if buf.startswith(q, i):
                return q
            if len(buf) - i < len(q) and q.startswith(buf[i:]):
                return ""
        return None

    def _param(self, text):
        if not text.strip():
            return []
        try:
            pairs = self._read(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            key, _, value = text.partition(self.ASSIGN)
            pairs = [(key.strip(), value.strip())]  # not a value: its text, as a string
        return self._send(pairs)


class BracedCallStream(_ScannedCallStream):
    """``call:f{city:<q>Paris<q>,days:3}`` (``gemma4``, ``function_gemma``): strings
    between ``quote`` delimiters hold anything, backslashes included."""

    OPEN = re.compile(r"\s*call:([\w.-]+)\s*\{")
    SEVERAL, ESCAPES, END, ASSIGN = False, False, "}", ":"

    def __init__(self, index, quote):
        super().__init__(index)
        self.QUOTES = (quote,)  # this family's delimiter, where the others are class-wide

    def _read(self, text):
        return list(braced_to_json("{" + text + "}", self.QUOTES[0]).items())


def gemma4_stream(index):
    """The ``gemma4`` stream."""
    return BracedCallStream(index, '<|"|>')


def function_gemma_stream(index):
    """The ``function_gemma`` stream."""
    return BracedCallStream(index, "<escape>")


class PythonicCallStream(_ScannedCallStream):
    """``[f(a=1, b="x"), g()]``: keyword arguments that are Python literals."""

    OPEN = re.compile(r"[\s\[,]*([A-Za-z_][\w.]*)\s*\(")
    SEVERAL, ESCAPES, END, ASSIGN = True, True, ")", "="
    QUOTES = ('"', "'")

    def _read(self, text):
        key, eq, value = text.partition("=")
        if not eq or not key.strip().isidentifier():
            raise ValueError("not a keyword argument")
        return [(key.strip(), ast.literal_eval(value.strip()))]
