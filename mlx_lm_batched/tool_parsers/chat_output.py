"""Split a chat model's output into answer, reasoning and tool calls, whole or as a
stream of text deltas (OpenAI's delta fields), never letting part of a marker reach
the answer."""

from .calls import tool_call
from .state_machine import TextStateMachine

ANSWER, REASONING, TOOL = "normal", "reasoning", "tool"


class ChatOutputParser:
    """Feed decoded text; get ``{"content", "reasoning_content", "tool_calls"}`` pieces.

    ``family``: a :class:`ToolFamily` or None (tool markup stays in the answer);
    ``think``: ``(start, end)`` reasoning markers or None; ``in_reasoning``: the prompt
    already opened the reasoning block (templates that end with ``<think>``). Whitespace
    between calls, or after the last one, is not content, nor is a call after others that
    the end of the output cut off.
    ``stream_calls``: :meth:`feed` sends each call as it is generated (a first delta
    with its id and name, then its arguments in JSON fragments: the family's
    ``stream``, see ``streamed_calls`` and ``streamed_params``) instead of whole at its
    end marker. A call sent while generated is not taken back: a body that would not
    parse whole is sent as it was read."""

    def __init__(self, family=None, think=None, in_reasoning=False, stream_calls=False):
        edges = {ANSWER: [], REASONING: [], TOOL: []}
        if think is not None:
            edges[ANSWER].append((think[0], REASONING))
            edges[REASONING].append((think[1], ANSWER))
        if family is not None:
            edges[ANSWER].append((family.start, TOOL))
            # Without an end marker a call runs to the next start marker (or the end).
            edges[TOOL].append((family.end, ANSWER) if family.end else (family.start, TOOL))
        self.family = family
        self._machine = TextStateMachine(edges)
        self._state = self._machine.make_state(REASONING if think and in_reasoning else ANSWER)
        self._body = ""
        self._streamed = None  # the family's CallStream of the block being generated
        self._stream_calls = stream_calls and family is not None and family.stream is not None
        self._gap = None  # whitespace after a call, held: dropped if a call or the end follows
        self.count = 0  # tool calls emitted (or opened, when streamed) so far

    def feed(self, text):
        """The pieces ``text`` completes (held-back text waits for the next feed)."""
        self._state, segments = TextStateMachine.split(self._state, text)
        return self._collect(segments)

    def finish(self):
        """The rest at the end of generation: held-back text, and an unclosed call (a
        family without an end marker, or one whose end token was not decoded)."""
        self._state, rest, name = TextStateMachine.flush(self._state)
        return self._collect([(name, rest)], closing=True)

    def parse(self, text):
        """Whole-response form of :meth:`feed` + :meth:`finish`."""
        first, last = self.feed(text), self.finish()
        return {k: first[k] + last[k] for k in first}

    def _collect(self, segments, closing=False):
        out = {"content": "", "reasoning_content": "", "tool_calls": []}
        for k, (state, text) in enumerate(segments):
            done = closing or k < len(segments) - 1  # later segments mean this state ended
            if state == TOOL:
                self._body += text
                if self._stream_calls:
                    self._stream_call(out, text)
                if done:  # closed by its end marker, or cut off at the end of the text
                    self._close_call(out, "" if closing else self.family.end)
            elif state == REASONING:
                out["reasoning_content"] += text
            elif state == ANSWER:
                if self._gap is not None:  # text after a call: only whitespace so far
                    text, self._gap = self._gap + text, None
                    if not text.strip():  # still only whitespace: keep holding it
                        self._gap = text
                        continue
                out["content"] += text
        return out

    def _stream_call(self, out, text):
        if self._streamed is None:
            self._streamed = self.family.stream(self.count)
        self._send(out, self._streamed, self._streamed.feed, text)

    def _send(self, out, streamed, step, *args):
        """Append the deltas of ``step(*args)`` (pieces of one call merged), counting the
        calls it opens."""
        opened = streamed.opened
        for delta in step(*args):
            last = out["tool_calls"][-1] if out["tool_calls"] else None
            if last is not None and last["index"] == delta["index"]:
                last["function"]["arguments"] += delta["function"]["arguments"]
            else:
                out["tool_calls"].append(delta)
        self.count += streamed.opened - opened

    def _close_call(self, out, end):
        body, self._body = self._body, ""
        streamed, self._streamed = self._streamed, None
        if streamed is not None and streamed.opened:
            self._send(out, streamed, streamed.close)  # the end of a call left open
            self._gap = ""  # whitespace after it is held, as after a whole call
            return  # sent while generated (a body that does not parse is sent as it is)
        try:
            calls = self.family.parse(body)
        except (ValueError, TypeError):  # not a call after all: the markup is the answer
            if self.count and not end and self.family.end:
                return  # a further call cut off by the end of the output: not an answer
            out["content"] += (self._gap or "") + self.family.start + body + end
            self._gap = None
            return
        for name, arguments in calls:
            out["tool_calls"].append(tool_call(name, arguments, self.count))
            self.count += 1
        self._gap = ""
