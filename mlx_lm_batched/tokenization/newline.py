"""mlx-lm's ``NewlineTokenizer``: a fast tokenizer for vocabularies that spell a line
break ``<n>``. Text is encoded with each ``"\\n"`` written ``<n>`` and decoded back.

Importing this module registers the class with ``AutoTokenizer``, so a checkpoint whose
``tokenizer_config.json`` names ``"tokenizer_class": "NewlineTokenizer"`` loads (the
``tokenization`` package imports it)."""

from .hf_classes import AutoTokenizer, PreTrainedTokenizerFast

NEWLINE = "<n>"


class NewlineTokenizer(PreTrainedTokenizerFast):
    """``PreTrainedTokenizerFast`` with ``"\\n"`` <-> ``<n>`` around encode and decode."""

    def encode(self, text, *args, **kwargs):
        return super().encode(text.replace("\n", NEWLINE), *args, **kwargs)

    def encode_batch(self, texts, **kwargs):
        return super().encode_batch([t.replace("\n", NEWLINE) for t in texts], **kwargs)

    def decode(self, *args, **kwargs):
        # transformers 5's batch_decode calls decode with a batch: a list comes back.
        out = super().decode(*args, **kwargs)
        return [t.replace(NEWLINE, "\n") for t in out] if isinstance(out, list) else \
            out.replace(NEWLINE, "\n")

    def batch_decode(self, *args, **kwargs):
        out = super().batch_decode(*args, **kwargs)  # transformers 5: through decode
        return [text.replace(NEWLINE, "\n") for text in out]


AutoTokenizer.register(NewlineTokenizer, fast_tokenizer_class=NewlineTokenizer, exist_ok=True)
