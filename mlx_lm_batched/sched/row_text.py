"""One row's text as it streams out of a batch: its own streaming detokenizer and its stop
strings. The Python API, the CLI and the server all turn a row's tokens into text here.

A stop string found in the text ends the row with ``finish_reason`` "stop" and cuts the
text before it; the caller then removes the row from its ``BatchGenerator`` (its tokens
are final: the stop string itself is not output unless asked, as vLLM's
``include_stop_str_in_output``). Text that could still grow into a stop string is held
back until it cannot.
"""

from ..sampling.text_stops import TextStops


class RowText:
    """Detokenize one row's tokens and match its stop strings."""

    def __init__(self, tokenizer, stops=(), include_stop=False, skip_ids=()):
        """``include_stop``: a stop string, and a stop token's text, stay in the output;
        ``skip_ids``: tokens whose text is left out (special tokens)."""
        self.detokenizer = tokenizer.make_detokenizer()
        self.stops = TextStops(stops, include_stop)
        self.include_stop = include_stop
        self.skip_ids = frozenset(skip_ids)

    def add(self, token, finish_reason=None):
        """Take one generated token; returns ``(text to output now, finish reason)``.

        ``finish_reason`` is the batch's: "stop" means a stop token (an EOS, whose text is
        not part of the answer), "length" the row's last token, None a running row. A
        stop string found in the text turns the result into "stop"."""
        if (finish_reason != "stop" or self.include_stop) and token not in self.skip_ids:
            self.detokenizer.add_token(token)
        if finish_reason is not None:
            self.detokenizer.finalize()
        text, matched = self.stops.feed(self.detokenizer.last_segment,
                                        final=finish_reason is not None)
        return text, ("stop" if matched else finish_reason)
