"""One row's text as it streams out of a batch: its own streaming detokenizer and its stop
strings. The Python API, the CLI and the server all turn a row's tokens into text here.

A stop string found in the text ends the row with ``finish_reason`` "stop" and cuts the
text before it; the caller then removes the row from its ``BatchGenerator`` (its tokens
are final: the stop string itself is never output). Text that could still grow into a
stop string is held back until it cannot.
"""

from ..sampling.text_stops import TextStops


class RowText:
    """Detokenize one row's tokens and match its stop strings."""

    def __init__(self, tokenizer, stops=()):
        self.detokenizer = tokenizer.make_detokenizer()
        self.stops = TextStops(stops)

    def add(self, token, finish_reason=None):
        """Take one generated token; returns ``(text to output now, finish reason)``.

        ``finish_reason`` is the batch's: "stop" means a stop token (an EOS, whose text is
        not part of the answer), "length" the row's last token, None a running row. A
        stop string found in the text turns the result into "stop"."""
        if finish_reason != "stop":
            self.detokenizer.add_token(token)
        if finish_reason is not None:
            self.detokenizer.finalize()
        text, matched = self.stops.feed(self.detokenizer.last_segment,
                                        final=finish_reason is not None)
        return text, ("stop" if matched else finish_reason)
