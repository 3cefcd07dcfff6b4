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
from .tokenization.newline import NewlineTokenizer
from .tokenization.sequences import no_bos_or_eos
from .tokenization.tokenizer import TokenizerWrapper, encode_prompt

__all__ = ["BPEStreamingDetokenizer", "NaiveStreamingDetokenizer", "NewlineTokenizer",
           "SPMStreamingDetokenizer", "StreamingDetokenizer", "TokenizerWrapper", "encode_prompt",
           "load", "load_tokenizer", "no_bos_or_eos"]
