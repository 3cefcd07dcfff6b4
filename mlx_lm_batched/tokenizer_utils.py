"""mlx-lm's ``mlx_lm.tokenizer_utils``: the tokenizer wrapper, its streaming
detokenizers and ``load`` (``tokenization/``)."""

from .tokenization.detokenizers import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    SPMStreamingDetokenizer,
    StreamingDetokenizer,
)
from .tokenization.tokenizer import (
    TokenizerWrapper,
    encode_prompt,
    load,
    load_tokenizer,
)

__all__ = ["BPEStreamingDetokenizer", "NaiveStreamingDetokenizer", "SPMStreamingDetokenizer",
           "StreamingDetokenizer", "TokenizerWrapper", "encode_prompt", "load", "load_tokenizer"]
