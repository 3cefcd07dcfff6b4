"""A Hugging Face tokenizer built from a GGUF's own tokenizer metadata, without torch.

A GGUF carries no ``tokenizer.json``; llama.cpp stores the vocabulary under
``tokenizer.ggml.*`` keys. This module turns that into a ``tokenizers.Tokenizer`` and
wraps it as a transformers ``PreTrainedTokenizerFast`` that ``save_pretrained`` writes
and ``AutoTokenizer.from_pretrained(dir)`` reloads offline. transformers' own GGUF
conversion is not used because its GGUF reader imports torch (a test oracle only here).

Two ``tokenizer.ggml.model`` kinds are supported:

- ``gpt2``: byte-level BPE with the file's merges (SmolLM2, Llama 3). The split before
  BPE follows ``tokenizer.ggml.pre`` as llama.cpp does.
- ``llama``: SentencePiece BPE with byte fallback (Gemma 3, Llama 2, Mistral). These
  files usually list no merges; they are derived from the vocabulary, ranked by score
  (by file order for Gemma, whose scores do not rank its user-defined pieces).

Encodings are checked against transformers' own GGUF conversion, sentencepiece and the
original tokenizers' rules in tests/test_gguf_tokenizer.py; where they disagree this
follows llama.cpp (SmolLM2's digit split, Gemma's whitespace runs, Llama 2's prefix space).
"""

import json
import os
import warnings

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import BPE

from ..tokenization.detokenizers import _unicode_to_byte
from .gguf import _parse, gguf_architecture

# Part of the tokenizer cache key (utils._gguf_tokenizer_dir): bump it whenever the files
# written here change, so a directory written by an older version is not reused.
TOKENIZER_VERSION = 2

SUPPORTED_TOKENIZERS = ("gpt2", "llama")
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types (1 normal, 2 unknown, 5 unused, 6 byte)
_SPM_SPACE = "\u2581"

# llama.cpp pre-tokenizers that split every digit on its own before the GPT-2 regex
# (llama-vocab.cpp: regex "\p{N}" then the GPT-2 pattern); the original SmolLM2
# tokenizer.json writes this as Sequence[Digits(individual), ByteLevel].
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}

# Split patterns of other llama.cpp pre-tokenizers (the tokenizer.json patterns of Llama 3
# and Qwen 2, which differ only in how many digits one piece takes).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_REGEX_SPLIT_PRE = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2_SPLIT),
}
# The plain GPT-2 pattern (ByteLevel's own regex).
_GPT2_PRE = {None, "default", "gpt2", "gpt-2"}


def _byte_alphabet():
    """GPT-2's byte -> printable character table (the inverse of the detokenizer's)."""
    return {b: c for c, b in _unicode_to_byte().items()}


def _merges_from_vocab(vocab, scores=None):
    """BPE merges implied by a vocabulary that lists none (SentencePiece BPE files).

    Every split of a piece into two pieces of the vocabulary is a merge. Merges rank by
    the merged piece's score, best first, then by a longer left part (without scores: by
    id, lowest first, then a shorter left part); ties keep vocabulary order. This is the
    order in which SentencePiece's BPE applies them, and the one transformers' GGUF
    conversion uses.
    """
    ranked = scores if scores is not None else vocab
    sign = -1 if scores is not None else 1
    merges = []
    for piece, score in ranked.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((sign * score, sign * cut, sign * len(right), left, right))
    merges.sort(key=lambda m: m[:3])  # stable: equal keys stay in vocabulary order
    return [(m[3], m[4]) for m in merges]


def _special_tokens(md, tokens):
    """bos/eos/unk/pad token strings from their ``tokenizer.ggml.*_token_id`` keys."""
    keys = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
            "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}
    out = {}
    for name, key in keys.items():
        token_id = md.get(f"tokenizer.ggml.{key}")
        if token_id is not None and 0 <= token_id < len(tokens):
            out[name] = tokens[token_id]
    return out


def _byte_level(md, tokens):
    """Byte-level BPE for a ``gpt2`` GGUF, with the file's merges: ``(Tokenizer, vocab,
    may_be_special)``, the last a test of which control tokens to add as special."""
    alphabet = _byte_alphabet()
    chars = set(alphabet.values())
    # Tokens are stored in the byte alphabet; a few files store some (added tokens with a
    # real space, say) as plain text, which BPE must see spelled byte by byte.
    spelled = [t if set(t) <= chars else "".join(alphabet[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    merges = md.get("tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in merges] if merges is not None else _merges_from_vocab(vocab)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False))
    pre = md.get("tokenizer.ggml.pre")
    if pre in _DIGIT_SPLIT_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    elif pre in _REGEX_SPLIT_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_REGEX_SPLIT_PRE[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        if pre not in _GPT2_PRE:
            warnings.warn(f"GGUF pre-tokenizer {pre!r} is not known here; splitting text with GPT-2's "
                          f"pattern, so some texts may tokenize differently than in llama.cpp", stacklevel=3)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel; it is not
    # a token the model was trained to see whole.
    return tok, vocab, lambda t: set(t) <= chars


def _sentencepiece(md, tokens, arch):
    """SentencePiece BPE with byte fallback for a ``llama`` GGUF: ``(Tokenizer, vocab,
    may_be_special)`` as for :func:`_byte_level`."""
    if arch == "gemma3":
        # Gemma stores its whitespace runs as real spaces ("  "), which the " " -> "▁"
        # normalizer never produces: spell them with "▁" as the model sees them.
        tokens = [_SPM_SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]
        # Gemma's scores give its user-defined pieces (whitespace and newline runs)
        # -1000, below every normal piece; its file order ranks them as trained.
        scores = {t: -i for i, t in enumerate(tokens)}
    else:
        scores = dict(zip(tokens, md.get("tokenizer.ggml.scores") or [-i for i in range(len(tokens))]))
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = md.get("tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in merges] if merges is not None else _merges_from_vocab(vocab, scores)
    unk = _special_tokens(md, tokens).get("unk_token")
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True, dropout=None))
    # Gemma adds no prefix space; Llama 2 / Mistral files do unless add_space_prefix says not.
    prefix = arch != "gemma3" and md.get("tokenizer.ggml.add_space_prefix", True)
    # Like sentencepiece and llama.cpp, the prefix "▁" goes before every piece of text, even
    # one that starts with a space, and after each special token (llama.cpp's
    # is_prev_special), which a Prepend normalizer does: it runs on each piece of text
    # between added tokens. (transformers' Metaspace(prepend_scheme="first") skips it
    # before a leading space and after special tokens.) Decoding drops that one space.
    replace = normalizers.Replace(" ", _SPM_SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(_SPM_SPACE), replace]) if prefix else replace
    tok.decoder = decoders.Sequence([decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok, vocab, lambda t: True


def _add_file_tokens(tok, md, tokens, vocab, may_be_special):
    """Control tokens become special added tokens, user-defined ones plain added tokens:
    llama.cpp matches both whole in the text instead of cutting them into pieces."""
    kinds = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, kinds)
                            if k == _CONTROL and may_be_special(t)])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, kinds)
                    if k == _USER_DEFINED and t in vocab])
    # Gemma's whitespace runs of 2..31 spaces are user-defined too. SentencePiece and
    # llama.cpp match user-defined pieces greedily (longest first) before BPE, so 40
    # spaces -> [31 spaces, 9 spaces]; checked against a sentencepiece model rebuilt from
    # the GGUF vocab (BPE merges alone give [16, 24]). As normalized added tokens they are
    # matched after " " -> "▁", longest first, with their own ids.
    runs = [_SPM_SPACE * len(t) for t, k in zip(tokens, kinds)
            if k == _USER_DEFINED and t and not t.strip(" ") and _SPM_SPACE * len(t) in vocab]
    tok.add_tokens([AddedToken(t, normalized=True, special=False) for t in runs])


def _post_processor(specials, vocab, add_bos, add_eos):
    """BOS/EOS around each sequence, as ``tokenizer.ggml.add_bos_token``/``add_eos_token`` say."""
    bos, eos = (specials.get(k) if add else None for k, add in (("bos_token", add_bos), ("eos_token", add_eos)))
    single = " ".join([f"{bos}:0"] * bool(bos) + ["$A:0"] + [f"{eos}:0"] * bool(eos))
    pair = single + " " + " ".join([f"{bos}:1"] * bool(bos) + ["$B:1"] + [f"{eos}:1"] * bool(eos))
    return processors.TemplateProcessing(single=single, pair=pair,
                                         special_tokens=[(t, vocab[t]) for t in (bos, eos) if t])


def build_gguf_tokenizer(metadata, arch):
    """A transformers ``PreTrainedTokenizerFast`` from a GGUF's metadata dict.

    ``arch`` is the GGUF's ``general.architecture`` (Gemma's SentencePiece vocabulary
    needs its own handling). Carries bos/eos/unk/pad, ``add_bos_token``/``add_eos_token``
    (a ``llama`` vocabulary adds BOS unless the file says otherwise, as in llama.cpp) and
    the chat template. ValueError for a ``tokenizer.ggml.model`` other than gpt2/llama.
    """
    from ..tokenization.hf_classes import PreTrainedTokenizerFast

    md = metadata
    kind = md.get("tokenizer.ggml.model")
    if kind not in SUPPORTED_TOKENIZERS:
        raise ValueError(f"unsupported GGUF tokenizer.ggml.model {kind!r}; supported: "
                         f"{', '.join(SUPPORTED_TOKENIZERS)}")
    tokens = md["tokenizer.ggml.tokens"]
    if kind == "gpt2":
        tok, vocab, may_be_special = _byte_level(md, tokens)
    else:
        tok, vocab, may_be_special = _sentencepiece(md, tokens, arch)
    _add_file_tokens(tok, md, tokens, vocab, may_be_special)
    specials = _special_tokens(md, tokens)
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False))
    tok.post_processor = _post_processor(specials, tok.get_vocab(), add_bos, add_eos)
    template = md.get("tokenizer.chat_template")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, **specials, add_bos_token=add_bos, add_eos_token=add_eos,
        clean_up_tokenization_spaces=False, **({"chat_template": template} if template else {}))


def save_gguf_tokenizer(path, out_dir):
    """Build the tokenizer a GGUF file describes and ``save_pretrained`` it to ``out_dir``.

    Reads only the file's metadata and needs no torch. Returns the tokenizer;
    ``AutoTokenizer.from_pretrained(out_dir)`` reloads it offline (as a
    ``PreTrainedTokenizerFast``, a class transformers 4 and 5 both know).
    """
    md = _parse(path, with_tensors=False)[0]
    tok = build_gguf_tokenizer(md, gguf_architecture(path, md))
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(out_dir)
    # transformers 5 writes its own class name (TokenizersBackend), unknown to transformers 4,
    # and leaves out add_bos_token/add_eos_token (tokenizer.json's post-processor applies them).
    config_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config.update(tokenizer_class="PreTrainedTokenizerFast", add_bos_token=tok.add_bos_token,
                  add_eos_token=tok.add_eos_token)
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return tok
