"""Tokenizer wrapper (drop-in for mlx-lm's tokenizer_utils); the streaming
detokenizers live in ``detokenizers.py`` and are re-exported here.

Batching: ``TokenizerWrapper.make_detokenizer()`` (and the ``detokenizer`` property)
hands out a fresh, independent detokenizer per call, so a batch driver keeps one per
row. The expensive token maps are built once per wrapper and shared read-only.
"""

import copy
import json
import os

from .hf_classes import AutoTokenizer

from .detokenizers import (
    detect_detokenizer,
)
from .markers import find_sequence, infer_structural_markers, infer_thinking
from .newline import NewlineTokenizer


class TokenizerWrapper:
    """An HF tokenizer plus streaming detokenizers and the EOS id set.

    Attributes not defined here (``encode``, ``decode``, ``eos_token_id``,
    ``bos_token``, ...) are read from and written to the wrapped tokenizer.
    """

    def __init__(self, tokenizer, detokenizer_class=None, eos_token_ids=None, chat_template=None,
                 tool_call_start=None, tool_call_end=None, tool_parser=None,
                 response_format=None):
        """``detokenizer_class`` defaults to ``detect_detokenizer(tokenizer)``.
        ``eos_token_ids`` (int or iterable) are extra stop ids; the tokenizer's own
        ``eos_token_id`` is always included. ``chat_template`` is a callable
        ``(messages, **kw) -> str`` (mlx-lm style) or a Jinja template string.
        ``tool_call_start``/``tool_call_end``/``tool_parser`` describe the model's
        tool-call markup (``load`` finds them from the chat template);
        ``response_format`` is mlx-lm's ``{"transitions": ..., "initial_state": ...}``."""
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
        self._tool_call = (tool_call_start, tool_call_end, tool_parser)
        self._response_format = response_format or {}
        self._thinking = None  # infer_thinking's answer, on first use (reads the vocabulary)
        self._vocab = None  # get_vocab()'s answer, on first use (see ``vocab``)

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
    def vocab(self):
        """The wrapped tokenizer's ``get_vocab()`` (token -> id), read once per wrapper and
        shared by every later read: listing a large vocabulary is slow (Gemma's 262144
        tokens take ~0.24 s here), and a wrapper's tokenizer does not change. Read-only."""
        if self._vocab is None:
            self._vocab = self._tokenizer.get_vocab()
        return self._vocab

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
            token_id = self.vocab.get(token)
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

    # Reasoning and tool-call markup (mlx-lm's properties of the same names).

    def _think(self, i):
        if self._thinking is None:
            self._thinking = infer_thinking(self._tokenizer, self.vocab)
        return self._thinking[i]

    @property
    def has_thinking(self):
        return self._think(0) is not None

    @property
    def think_start(self):
        return self._think(0)

    @property
    def think_end(self):
        return self._think(1)

    @property
    def think_start_tokens(self):
        return self._think(2)

    @property
    def think_end_tokens(self):
        return self._think(3)

    @property
    def think_start_id(self):
        return _single_id(self._think(2), "start")

    @property
    def think_end_id(self):
        return _single_id(self._think(3), "end")

    # mlx-lm's private name for the search below (code written for it calls it).
    _find = staticmethod(find_sequence)

    def find_think_start(self, tokens, start=None, end=None):
        return find_sequence(tokens, self.think_start_tokens, start, end)

    def rfind_think_start(self, tokens, start=None, end=None):
        return find_sequence(tokens, self.think_start_tokens, start, end, reverse=True)

    def find_think_end(self, tokens, start=None, end=None):
        return find_sequence(tokens, self.think_end_tokens, start, end)

    def rfind_think_end(self, tokens, start=None, end=None):
        return find_sequence(tokens, self.think_end_tokens, start, end, reverse=True)

    @property
    def structural_markers(self):
        return infer_structural_markers(self.vocab)

    @property
    def has_tool_calling(self):
        return self._tool_call[0] is not None

    @property
    def tool_call_start(self):
        return self._tool_call[0]

    @property
    def tool_call_end(self):
        return self._tool_call[1]

    @property
    def tool_call_start_tokens(self):
        return self._marker_ids(self._tool_call[0])

    @property
    def tool_call_end_tokens(self):
        return self._marker_ids(self._tool_call[1]) if self._tool_call[0] is not None else None

    @property
    def tool_parser(self):
        """``parse(text, tools=None)`` of the model's tool-call family (mlx-lm's callable),
        or None."""
        return self._tool_call[2]

    @property
    def response_transitions(self):
        return self._response_format.get("transitions", {})

    @property
    def response_initial_state(self):
        return self._response_format.get("initial_state")

    def _marker_ids(self, text):
        return None if text is None else tuple(self._tokenizer.encode(text,
                                                                      add_special_tokens=False))

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


def _single_id(ids, which):
    if ids is None:
        return None
    if len(ids) > 1:
        raise ValueError(f"the reasoning {which} marker is {len(ids)} tokens, not one: "
                         f"use think_{which}_tokens")
    return ids[0]


def wrap_tokenizer(tokenizer):
    """``tokenizer`` as a :class:`TokenizerWrapper` (wrapped unless it is one)."""
    return tokenizer if isinstance(tokenizer, TokenizerWrapper) else TokenizerWrapper(tokenizer)


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


def load_tokenizer(model_path, tokenizer_config_extra=None, eos_token_ids=None, tool_markup=None):
    """Load the tokenizer of a local model directory into a TokenizerWrapper.

    The detokenizer is chosen from the ``decoder`` of the loaded fast backend
    (or of tokenizer.json when there is none). If ``eos_token_ids`` is None, the ``eos_token_id`` (int or list) of
    generation_config.json, else of config.json, is used, as mlx-lm's loader does;
    instruct models often list their end-of-turn token only there.
    ``tokenizer_config_extra`` is passed to ``AutoTokenizer.from_pretrained``.
    ``tool_markup(chat_template, vocab)`` returns the tool-call ``(start, end, parser)``
    for the wrapper, or None (the loader passes the tool-call families' detection).
    """
    model_path = os.fspath(model_path)
    extra = tokenizer_config_extra or {}
    if _read_json(os.path.join(model_path, "tokenizer_config.json")).get(
            "tokenizer_class") == "NewlineTokenizer":
        # Ours by name, not through AutoTokenizer's registry: another library registering
        # a class of the same name (mlx-lm's loses the merges under transformers 5) wins
        # there if it registers later.
        tokenizer = NewlineTokenizer.from_pretrained(model_path, **extra)
    else:
        tokenizer = AutoTokenizer.from_pretrained(model_path, **extra)
    decoder = None
    if getattr(tokenizer, "backend_tokenizer", None) is None:  # else the backend knows
        decoder = _read_json(os.path.join(model_path, "tokenizer.json")).get("decoder")
    factory = detect_detokenizer(tokenizer, decoder=decoder)
    if eos_token_ids is None:
        for name in ("generation_config.json", "config.json"):
            eos_token_ids = _read_json(os.path.join(model_path, name)).get("eos_token_id")
            if eos_token_ids is not None:
                break
    wrapper = TokenizerWrapper(tokenizer, factory, eos_token_ids=eos_token_ids)
    if tool_markup is not None:
        # Through the wrapper's vocabulary: the one read its reasoning markers reuse.
        tool_call = tool_markup(getattr(tokenizer, "chat_template", None), wrapper.vocab)
        wrapper._tool_call = tool_call or (None, None, None)
    return wrapper


load = load_tokenizer  # mlx-lm's name
