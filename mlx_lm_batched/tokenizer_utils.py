"""Tokenizer wrapper and streaming detokenizers (drop-in for mlx-lm's tokenizer_utils).

Batching: ``TokenizerWrapper.make_detokenizer()`` (and the ``detokenizer`` property)
hands out a fresh, independent detokenizer per call, so a batch driver keeps one per
row. The expensive token maps are built once per wrapper and shared read-only.

Special-token convention (same as mlx-lm): detokenizers reproduce
``tokenizer.decode(tokens)`` with the default ``skip_special_tokens=False``, so a
special token that is fed in appears in the text. Generation loops stop on EOS
*before* feeding it, which is how EOS stays out of the output. Unlike mlx-lm's BPE
detokenizer we do not drop the leading space of the first token, because
``decode`` keeps it; the invariant is ``"".join(segments) == tokenizer.decode(tokens)``.
"""

import codecs
import copy
import functools
import json
import os
import re

from transformers import AutoTokenizer

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


class TokenizerWrapper:
    """An HF tokenizer plus streaming detokenizers and the EOS id set.

    Attributes not defined here (``encode``, ``decode``, ``eos_token_id``,
    ``bos_token``, ...) are read from and written to the wrapped tokenizer.
    """

    def __init__(self, tokenizer, detokenizer_class=None, eos_token_ids=None, chat_template=None):
        """``detokenizer_class`` defaults to ``detect_detokenizer(tokenizer)``.
        ``eos_token_ids`` (int or iterable) are extra stop ids; the tokenizer's own
        ``eos_token_id`` is always included. ``chat_template`` is a callable
        ``(messages, **kw) -> str`` (mlx-lm style) or a Jinja template string."""
        self._tokenizer = tokenizer
        factory = detokenizer_class or detect_detokenizer(tokenizer)
        # Built once: token maps are expensive; copies share them read-only.
        self._prototype = factory(tokenizer)
        if isinstance(eos_token_ids, int):
            eos_token_ids = [eos_token_ids]
        self._eos_token_ids = set(eos_token_ids or [])
        if tokenizer.eos_token_id is not None:
            self._eos_token_ids.add(tokenizer.eos_token_id)
        self._chat_template = chat_template

    def make_detokenizer(self):
        """A new, reset detokenizer independent of every other one (one per batch row)."""
        detok = copy.copy(self._prototype)
        detok.reset()  # reset() rebinds all state, so nothing mutable is shared
        return detok

    @property
    def detokenizer(self):
        """A fresh detokenizer on every access (as in mlx-lm): keep the returned
        object for the whole stream rather than re-reading this property."""
        return self.make_detokenizer()

    @property
    def eos_token_ids(self):
        return self._eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, value):
        self._eos_token_ids = set(value) if value is not None else set()

    def add_eos_token(self, token):
        """Add a stop token given as an id, a numeric string, or a token string."""
        try:
            token_id = int(token)
        except ValueError:
            # convert_tokens_to_ids maps unknown strings to <unk>, so check the vocab.
            token_id = self._tokenizer.get_vocab().get(token)
            if token_id is None:
                raise ValueError(f"'{token}' is not a token for this tokenizer") from None
        self._eos_token_ids.add(token_id)

    @property
    def has_chat_template(self):
        return self._chat_template is not None or getattr(self._tokenizer, "chat_template", None) is not None

    def apply_chat_template(self, *args, tokenize=True, **kwargs):
        """Like the HF method, but returns a plain list of ids (or a str)."""
        if callable(self._chat_template):
            out = self._chat_template(*args, **kwargs)
            # The rendered text already holds the template's specials (BOS included).
            return self._tokenizer.encode(out, add_special_tokens=False) if tokenize else out
        if self._chat_template is not None:
            kwargs.setdefault("chat_template", self._chat_template)
        kwargs["return_dict"] = False
        return self._tokenizer.apply_chat_template(*args, tokenize=tokenize, **kwargs)

    def encode_prompt(self, prompt, add_special_tokens=None):
        """See :func:`encode_prompt`."""
        return encode_prompt(self._tokenizer, prompt, add_special_tokens)

    def __len__(self):
        return len(self._tokenizer)  # dunders bypass __getattr__

    def __getattr__(self, attr):
        # Only called for names not found normally. Private names and names this
        # class defines are not forwarded, so a failing property reports itself
        # (and copy/pickle probing cannot recurse into _tokenizer).
        if attr.startswith("_") or hasattr(type(self), attr):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
        return getattr(self._tokenizer, attr)

    def __setattr__(self, attr, value):
        if attr.startswith("_") or hasattr(type(self), attr):
            object.__setattr__(self, attr, value)  # our state, and property setters
        else:
            setattr(self._tokenizer, attr, value)


def encode_prompt(tokenizer, prompt, add_special_tokens=None):
    """Encode a prompt without ever producing a doubled BOS.

    The classic bug: a chat template renders text that already begins with the
    BOS token (Gemma's ``<bos>``, Llama's ``<s>``), and ``encode`` then prepends
    another one; models degrade noticeably on ``<bos><bos>``. With
    ``add_special_tokens=None`` specials are added only when the text does not
    already start with the BOS string (mlx-lm's rule). Even when the caller
    forces ``True``, a BOS duplicated this way is removed. A list of ids is
    returned unchanged. Works on a raw HF tokenizer or a TokenizerWrapper.
    """
    if not isinstance(prompt, str):
        return list(prompt)
    bos = tokenizer.bos_token
    starts_with_bos = bool(bos) and prompt.startswith(bos)
    if add_special_tokens is None:
        add_special_tokens = not starts_with_bos
    ids = list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
    bos_id = tokenizer.bos_token_id
    if starts_with_bos and len(ids) >= 2 and ids[0] == ids[1] == bos_id:
        ids = ids[1:]
    return ids


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def load_tokenizer(model_path, tokenizer_config_extra=None, eos_token_ids=None):
    """Load the tokenizer of a local model directory into a TokenizerWrapper.

    The detokenizer is chosen from the ``decoder`` of the loaded fast backend
    (or of tokenizer.json when there is none). If ``eos_token_ids`` is None, the ``eos_token_id`` (int or list) of
    generation_config.json, else of config.json, is used, as mlx-lm's loader does;
    instruct models often list their end-of-turn token only there.
    ``tokenizer_config_extra`` is passed to ``AutoTokenizer.from_pretrained``.
    """
    model_path = os.fspath(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path, **(tokenizer_config_extra or {}))
    decoder = None
    if getattr(tokenizer, "backend_tokenizer", None) is None:  # else the backend knows
        decoder = _read_json(os.path.join(model_path, "tokenizer.json")).get("decoder")
    factory = detect_detokenizer(tokenizer, decoder=decoder)
    if eos_token_ids is None:
        for name in ("generation_config.json", "config.json"):
            eos_token_ids = _read_json(os.path.join(model_path, name)).get("eos_token_id")
            if eos_token_ids is not None:
                break
    return TokenizerWrapper(tokenizer, factory, eos_token_ids=eos_token_ids)


load = load_tokenizer  # mlx-lm's name
