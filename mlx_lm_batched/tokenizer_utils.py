"""mlx-lm's ``mlx_lm.tokenizer_utils``: the tokenizer wrapper, its streaming
detokenizers and ``load`` (``tokenization/``, ``loading/``)."""

from .tokenization.detokenizers import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    SPMStreamingDetokenizer,
    StreamingDetokenizer,
)
from .loading.save import load_tokenizer
from .loading.save import load_tokenizer as load  # with the tool-call markup found
from .tokenization.tokenizer import TokenizerWrapper, encode_prompt

__all__ = ["BPEStreamingDetokenizer", "NaiveStreamingDetokenizer", "SPMStreamingDetokenizer",
           "StreamingDetokenizer", "TokenizerWrapper", "encode_prompt", "load", "load_tokenizer"]
