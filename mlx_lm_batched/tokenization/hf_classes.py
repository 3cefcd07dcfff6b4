"""transformers' tokenizer classes, imported once for the whole package.

Without torch (a plain ``pip install``: torch is a test oracle only), importing
transformers logs "PyTorch was not found. Models won't be available ..." on every run of
every command. The advice is about transformers' own models, which this package never
uses, so that one record is dropped; every other transformers message passes. Each module
that needs transformers' tokenizers imports them from here so the filter is in place
before the first import of transformers.
"""

import logging


def _not_torch_advice(record):
    return "PyTorch was not found" not in record.getMessage()


logging.getLogger("transformers").addFilter(_not_torch_advice)

from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

__all__ = ["AutoTokenizer", "PreTrainedTokenizerFast"]
