"""Streaming detokenizers: text of one row at a time, token by token.

Special-token convention (same as mlx-lm): detokenizers reproduce
``tokenizer.decode(tokens)`` with the default ``skip_special_tokens=False``, so a
special token that is fed in appears in the text. Generation loops stop on EOS
*before* feeding it, which is how EOS stays out of the output. Unlike mlx-lm's BPE
detokenizer we do not drop the leading space of the first token, because
``decode`` keeps it; the invariant is ``"".join(segments) == tokenizer.decode(tokens)``.
"""

import codecs
import functools
import json
import re

_SPM_SPACE = "\u2581"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class StreamingDetokenizer:
    """Interface: ``reset()``, ``add_token(id)``, ``finalize()``, ``text``,
    ``last_segment``, ``tokens`` and ``offset`` (characters already returned).

    ``text`` only ever grows, and only by text that is final, so streamed
    segments never need to be retracted.
    """

    def reset(self):
        """Drop all streaming state (token maps derived from the tokenizer stay)."""
        self.offset = 0
        self.tokens = []
        self._text = ""

    def add_token(self, token):
        """Consume one token id."""
        raise NotImplementedError

    def finalize(self):
        """Flush everything held back; call once the stream has ended."""
        raise NotImplementedError

    @property
    def text(self):
        """All final text so far."""
        return self._text

    @property
    def last_segment(self):
        """Text that became final since the previous read (reading consumes it)."""
        text = self.text
        segment = text[self.offset :]
        self.offset = len(text)
        return segment


class NaiveStreamingDetokenizer(StreamingDetokenizer):
    """Decode-and-diff detokenizer; correct for any tokenizer, O(line length^2).

    Tokens since the last committed newline are re-decoded on each read of
    ``text``. Held back: trailing U+FFFD (an unfinished multi-byte character) and,
    when ``decode`` cleans up spaces (" ," -> ","), a short tail starting with a space.
    """

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        probe = tokenizer.encode("a ,b", add_special_tokens=False)
        self._clean_spaces = " ," not in tokenizer.decode(probe)
        self.reset()

    def reset(self):
        super().reset()
        self._window = []  # tokens not yet committed
        self._shown = ""  # window text already exposed through `text`
        self._dirty = False
        # The window is decoded behind the last committed token so that decoders
        # which strip the first leading space (Llama's Strip) do not eat the
        # space of a word that follows a newline.
        self._ctx = []
        self._ctx_text = ""

    def add_token(self, token):
        self.tokens.append(token)
        self._window.append(token)
        self._dirty = True

    def _decode_window(self):
        full = self._tokenizer.decode(self._ctx + self._window)
        if not full.startswith(self._ctx_text):
            return None  # the new tokens changed how the context decodes: wait
        return full[len(self._ctx_text) :]

    def _commit(self, window_text):
        self._text += window_text
        self._ctx = self._window[-1:]
        self._ctx_text = self._tokenizer.decode(self._ctx)
        self._window, self._shown = [], ""

    @property
    def text(self):
        if self._dirty and self._window:
            self._dirty = False
            raw = self._decode_window()
            if raw is not None and raw.endswith("\n"):
                self._commit(raw)
            elif raw is not None:
                stable = raw.rstrip("\ufffd")
                if self._clean_spaces:
                    # Cleanup patterns (" n't", " ' ", ...) are at most 4 chars.
                    tail = stable[-3:]
                    if " " in tail:
                        stable = stable[: len(stable) - len(tail) + tail.index(" ")]
                if stable.startswith(self._shown):  # never retract shown text
                    self._shown = stable
        return self._text + self._shown

    def finalize(self):
        if self._window:
            raw = self._decode_window()
            if raw is None:  # degenerate: fall back to decoding the window alone
                raw = self._tokenizer.decode(self._window)
            self._commit(raw)
        self._dirty = False


def _token_strings(tokenizer):
    """Token string per id, None for ids without a token (gaps, padded vocabularies).

    HF ``decode`` silently drops ids it does not know, so the detokenizers skip
    them too (an unknown id must not even end a byte-fallback run)."""
    return tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))


class SPMStreamingDetokenizer(StreamingDetokenizer):
    """Detokenizer for the SentencePiece decoder ``Replace(▁, ' ') + ByteFallback +
    Fuse (+ Strip(' ', 1, 0))``, linear time.

    ``<0xNN>`` tokens are gathered into a byte run that is decoded when the run
    ends (next non-byte token, or ``finalize``). Emitting characters earlier would
    be wrong: tokenizers' ByteFallback turns a *whole* run into one U+FFFD per byte
    as soon as any part of it is invalid UTF-8, so a completed "€" in a run that
    later goes bad must still come out as "\\ufffd\\ufffd\\ufffd".
    """

    def __init__(self, tokenizer, trim_space=False):
        # trim_space: the decoder ends with Strip(' ', 1, 0), i.e. decode() drops
        # one leading space of the whole text (Llama/Mistral); Gemma has no Strip.
        self.trim_space = trim_space
        self.tokenmap = []  # str piece, or int for a byte-fallback token
        for piece in _token_strings(tokenizer):
            m = _BYTE_TOKEN.fullmatch(piece or "")
            if m:
                piece = int(m.group(1), 16)
            elif piece is not None:
                piece = piece.replace(_SPM_SPACE, " ")
            self.tokenmap.append(piece)
        self.reset()

    def reset(self):
        super().reset()
        self._run = bytearray()
        self._at_start = True  # Strip removes at most one space, at the very start

    def _emit(self, piece):
        if self._at_start and piece:
            self._at_start = False
            if self.trim_space and piece[0] == " ":
                piece = piece[1:]
        self._text += piece

    def _flush_run(self):
        if self._run:
            try:
                piece = self._run.decode("utf-8")
            except UnicodeDecodeError:
                piece = "\ufffd" * len(self._run)
            self._run = bytearray()
            self._emit(piece)

    def add_token(self, token):
        self.tokens.append(token)
        piece = self.tokenmap[token] if 0 <= token < len(self.tokenmap) else None
        if piece is None:
            return
        if isinstance(piece, int):
            self._run.append(piece)
        else:
            self._flush_run()
            self._emit(piece)

    def finalize(self):
        self._flush_run()


@functools.lru_cache(maxsize=1)
def _unicode_to_byte():
    """Inverse of GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for
    themselves, the other 68 bytes were shifted to U+0100.. in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in table.values())
    table.update({chr(0x100 + n): b for n, b in enumerate(shifted)})
    return table


def _byte_level_bytes(piece):
    """Bytes of a token as tokenizers' ByteLevel decoder sees them: mapped char by
    char, or, if any char is outside the map (e.g. an added token with a real
    space), the token's own UTF-8, whole."""
    table = _unicode_to_byte()
    try:
        return bytes(table[c] for c in piece)
    except KeyError:
        return piece.encode("utf-8")


class BPEStreamingDetokenizer(StreamingDetokenizer):
    """Detokenizer for byte-level BPE (GPT-2 style ``ByteLevel`` decoder), linear time.

    Token bytes go through an incremental UTF-8 decoder, so text is released only
    at complete-character boundaries; invalid bytes become U+FFFD like
    ``decode`` (which uses lossy UTF-8 over the whole byte string)."""

    def __init__(self, tokenizer):
        self.tokenmap = [_byte_level_bytes(p or "") for p in _token_strings(tokenizer)]
        self.reset()

    def reset(self):
        super().reset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def add_token(self, token):
        self.tokens.append(token)
        data = self.tokenmap[token] if 0 <= token < len(self.tokenmap) else b""
        self._text += self._utf8.decode(data)

    def finalize(self):
        self._text += self._utf8.decode(b"", final=True)


def _match_decoder(decoder):
    """Map a tokenizer.json ``decoder`` entry to a detokenizer factory."""
    if not isinstance(decoder, dict):
        return NaiveStreamingDetokenizer
    if decoder.get("type") == "ByteLevel":
        return BPEStreamingDetokenizer
    if decoder.get("type") != "Sequence":
        return NaiveStreamingDetokenizer
    steps = [
        {k: v for k, v in d.items() if k in ("type", "pattern", "content", "start", "stop")}
        for d in decoder.get("decoders", [])
    ]
    spm = [
        {"type": "Replace", "pattern": {"String": _SPM_SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if steps == spm:
        return SPMStreamingDetokenizer
    if steps == spm + [{"type": "Strip", "content": " ", "start": 1, "stop": 0}]:
        return functools.partial(SPMStreamingDetokenizer, trim_space=True)
    return NaiveStreamingDetokenizer


def _decode_is_plain(tokenizer):
    """True if ``decode`` is the backend decoder's output untouched: no subclass
    post-processing and no clean-up of spaces, which the fast paths do not model."""
    for name in ("decode", "_decode", "convert_tokens_to_string"):
        fn = getattr(type(tokenizer), name, None)
        if fn is not None and not fn.__module__.startswith("transformers.tokenization_utils"):
            return False
    probe = tokenizer.encode("a ,b n't", add_special_tokens=False)
    return tokenizer.decode(probe) == "a ,b n't"


def detect_detokenizer(tokenizer, decoder=None):
    """Pick the detokenizer factory (a class or ``functools.partial``) for a tokenizer.

    ``decoder`` is the ``decoder`` entry of tokenizer.json; when omitted it is read
    from the tokenizer's fast backend. ByteLevel -> BPE; Replace(▁)+ByteFallback+Fuse
    (+Strip) -> SPM; anything else, or a tokenizer whose ``decode`` does extra
    work, -> naive.
    """
    if decoder is None:
        backend_decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        if backend_decoder is not None:
            # The decoder's own JSON: serializing the whole tokenizer is slow on big vocabs.
            decoder = json.loads(backend_decoder.__getstate__())
    factory = _match_decoder(decoder)
    if factory is not NaiveStreamingDetokenizer and not _decode_is_plain(tokenizer):
        return NaiveStreamingDetokenizer
    return factory
