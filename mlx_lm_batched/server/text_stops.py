"""Stop strings matched on a row's detokenized text as it streams.

Text that could still be the start of a stop string is held back, so a client never
receives part of a stop string; once one appears, the text before it is final.
"""


class TextStops:
    """Feed text with :meth:`feed`; it returns ``(safe text, stopped)``."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self._held = ""  # text not yet released

    def feed(self, text, final=False):
        """Add ``text``; return the text now safe to send and whether a stop string ended
        it. ``final`` releases everything held (the row is done)."""
        held = self._held + text
        if not self.stops:
            self._held = ""
            return held, False
        hits = [i for i in (held.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return held[: min(hits)], True
        if final:
            self._held = ""
            return held, False
        keep = 0  # the longest tail of ``held`` that begins some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(held)), keep, -1):
                if held.endswith(s[:n]):
                    keep = n
                    break
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep], False
