"""``TextStateMachine`` (mlx-lm's name and interface): follow decoded text through
states (answer, reasoning, tool call) switched by marker strings, strip the markers,
and hold back only text that could still be the start of a marker.

Matching text, not token ids, is robust to a marker split across tokens or merged
with the next byte."""


class TextStateMachine:
    """``transitions``: ``{state: [(marker, next_state), ...]}``; a ``next_state`` of
    None ends the text. The runtime state is a tuple ``(state name, None, transitions,
    held-back text)`` threaded through :meth:`split`, :meth:`step` and :meth:`flush`."""

    def __init__(self, transitions=None):
        self._transitions = {s: list(edges) for s, edges in (transitions or {}).items()}

    def make_state(self, initial="normal"):
        """A fresh runtime state starting in ``initial``."""
        self._transitions.setdefault(initial, [])
        return (initial, None, self._transitions, "")

    @staticmethod
    def split(state, text):
        """Consume ``text``: ``(new state, [(state name, text), ...])``, one segment per
        state passed through (markers removed); the last is the current state."""
        name, _, transitions, buf = state
        buf += text
        segments = []
        while True:
            edges = transitions.get(name, [])
            hits = [(buf.find(m), -len(m), m, nxt) for m, nxt in edges if m and m in buf]
            if not hits:
                break
            at, _, marker, nxt = min(hits)
            segments.append((name, buf[:at]))
            buf, name = buf[at + len(marker):], nxt
            if name is None:
                segments.append((None, ""))
                return (None, None, transitions, buf), segments
        keep = _held_back(buf, [m for m, _ in transitions.get(name, []) if m])
        segments.append((name, buf[: len(buf) - keep]))
        return (name, None, transitions, buf[len(buf) - keep:]), segments

    @staticmethod
    def step(state, text):
        """As :meth:`split`: ``(new state, text to emit, current state name)``."""
        state, segments = TextStateMachine.split(state, text)
        return state, "".join(t for _, t in segments), state[0]

    @staticmethod
    def flush(state):
        """Release the held-back text at the end: ``(state, text, state name)``."""
        name, _, transitions, buf = state
        return (name, None, transitions, ""), buf, name

    @staticmethod
    def discard(state):
        """Drop the held-back text (a stop ended the text): ``(state, state name)``."""
        name, _, transitions, _ = state
        return (name, None, transitions, ""), name


def make_text_state_machine(tokenizer, stop_words=None):
    """mlx-lm's machine for a tokenizer (its ``has_thinking``, ``tool_call_start`` ...
    properties): reasoning and tool-call states, structural markers and the response
    format's transitions; ``stop_words`` are stripped in every state without leaving it."""
    transitions = {}
    if tokenizer.has_thinking:
        transitions.setdefault("normal", []).append((tokenizer.think_start, "reasoning"))
        transitions["reasoning"] = [(tokenizer.think_end, "normal")]
    if tokenizer.has_tool_calling:
        # A response format whose transitions lead to "tool" decides where calls start.
        targets = {dst for edges in tokenizer.response_transitions.values() for _, dst in edges}
        if "tool" not in targets:
            transitions.setdefault("normal", []).append((tokenizer.tool_call_start, "tool"))
        if tokenizer.has_thinking:
            transitions["reasoning"].append((tokenizer.tool_call_start, "tool"))
        end = tokenizer.tool_call_end
        transitions["tool"] = [(end, "normal")] if end else []
    for marker in tokenizer.structural_markers:
        transitions.setdefault("normal", []).append((marker, "normal"))
    for name, edges in tokenizer.response_transitions.items():
        transitions.setdefault(name, []).extend(edges)
    for name in set(transitions) | {"normal"}:
        for word in stop_words or ():
            transitions.setdefault(name, []).append((word, name))
    return TextStateMachine(transitions or None)


def _held_back(text, markers):
    """Length of the longest tail of ``text`` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best
