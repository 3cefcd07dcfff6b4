"""Stop strings matched on a row's detokenized text, as mlx-lm's server does.

A :class:`TextStops` is fed the row's new text pieces; it passes on the text that
can no longer be part of a stop string, holds back the end that might still grow
into one, and on a match gives the text before the stop (the stop itself is
never output).
"""


def check_stops(stop, n):
    """One list of stop strings per prompt from ``stop``: None, a string, a list of
    strings (shared by every prompt) or one such entry per prompt.

    Raises ``TypeError`` for anything else and ``ValueError`` for a per-prompt list
    whose length is not ``n``.
    """
    def one(value, what):
        if value is None:
            return []
        if isinstance(value, str):
            return [value] if value else []
        if isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
            return [s for s in value if s]
        raise TypeError(f"{what} must be a string or a list of strings, got {value!r:.80}")

    if stop is None or isinstance(stop, str):
        return [one(stop, "stop")] * n
    if not isinstance(stop, (list, tuple)):
        raise TypeError(f"stop must be a string, a list of strings or one per prompt, "
                        f"got {type(stop).__name__}")
    if all(isinstance(s, str) for s in stop):
        return [one(list(stop), "stop")] * n
    if len(stop) != n:
        raise ValueError(f"stop must have one entry per prompt: expected {n}, got {len(stop)}")
    return [one(s, f"stop[{i}]") for i, s in enumerate(stop)]


def cut_at_stop(text, stops, include=False):
    """``text`` up to the first occurrence of any of ``stops`` (all of it if none);
    ``include``: up to the end of that stop string (the longest one starting there)."""
    found = [(i, len(s)) for i, s in ((text.find(s), s) for s in stops) if i >= 0]
    if not found:
        return text
    start, length = min(found, key=lambda f: (f[0], -f[1]))
    return text[: start + length] if include else text[:start]


class TextStops:
    """One row's stop-string matcher over its streamed text: feed it the row's new text
    pieces; it passes on what can no longer be part of a stop string."""

    def __init__(self, stops, include=False):
        self.stops = [s for s in stops if s]
        self.include = include  # vLLM's include_stop_str_in_output: keep the stop string
        self._held = ""  # text not yet passed on (it may begin a stop string)

    def feed(self, piece, final=False):
        """Add ``piece``; returns ``(text to output now, matched)``. ``final`` (the row
        ended) also releases the held-back text when no stop string matched."""
        held = self._held + piece
        self._held = ""
        if not self.stops:
            return held, False
        cut = cut_at_stop(held, self.stops)
        if len(cut) < len(held):
            return (cut_at_stop(held, self.stops, True) if self.include else cut), True
        keep = 0 if final else self._pending_prefix(held)
        self._held = held[len(held) - keep:] if keep else ""
        return held[: len(held) - keep], False

    def flush(self):
        """The held-back text (the row ended without a match)."""
        held, self._held = self._held, ""
        return held

    def _pending_prefix(self, text):
        """Length of the longest end of ``text`` that is a proper prefix of a stop."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
