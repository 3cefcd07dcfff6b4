"""Constrained decoding: a per-row logits processor that masks every token a grammar forbids.

The grammar engine is llguidance (chosen by measurement, see CHANGELOG and
``scripts/bench_grammar_mask.py``): JSON schemas, regular expressions and Lark grammars
are compiled by it, never by this package. Each constrained row gets its own
:class:`GrammarProcessor` (a matcher holds that row's parse state); rows without one
are untouched, so constrained and free rows share a batch.

Constraints are described as OpenAI / vLLM describe them:

- ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``
  (any JSON object), ``{"type": "json_schema", "json_schema": {"name": ..., "schema":
  {...}, "strict": true}}``;
- ``regex`` (vLLM's ``guided_regex``, SGLang's ``regex``): a regular expression;
- ``grammar`` (vLLM's ``guided_grammar``, SGLang's ``ebnf``): a Lark grammar.
"""

import json
from typing import Optional

import mlx.core as mx
import numpy as np

_TOKENIZERS = {}  # id(tokenizer) -> (tokenizer, LLTokenizer): building one costs seconds


def _llguidance():
    import llguidance  # an import error here names the missing dependency

    return llguidance


def grammar_tokenizer(tokenizer):
    """The llguidance tokenizer for ``tokenizer`` (a ``TokenizerWrapper`` or a HF fast
    tokenizer), built once per tokenizer object: its vocabulary's byte strings are what
    the engine matches the grammar against."""
    key = id(tokenizer)
    hit = _TOKENIZERS.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError("constrained decoding needs a fast (tokenizer.json) tokenizer; "
                        f"got {type(tokenizer).__name__}")
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    ll = _llguidance().LLTokenizer(backend.to_str(), eos_token=int(eos[0]))
    _TOKENIZERS[key] = (tokenizer, ll)
    return ll


def grammar_spec(response_format=None, regex=None, grammar=None):
    """The llguidance grammar for one request's constraint fields, or None (unconstrained).

    At most one of the three may constrain the output; a bad value raises ``ValueError``
    naming the field (the server answers it with a 400).
    """
    ll = _llguidance()
    given = [name for name, v in (("response_format", response_format), ("regex", regex),
                                  ("grammar", grammar)) if v is not None]
    if response_format is not None:
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind == "text":
            given.remove("response_format")
            response_format = None
        elif kind not in ("json_object", "json_schema"):
            raise ValueError(f"response_format: unsupported type {kind!r} "
                             "(supported: 'text', 'json_object', 'json_schema')")
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)}: give at most one output constraint")
    if not given:
        return None
    if response_format is not None:
        schema = _schema_of(response_format)
        try:
            spec = ll.LLMatcher.grammar_from_json_schema(
                schema, defaults={"whitespace_flexible": False})
        except Exception as e:  # the engine's message says what in the schema is wrong
            raise ValueError(f"response_format: invalid JSON schema: {e}") from None
        field = "response_format"
    elif regex is not None:
        if not isinstance(regex, str):
            raise TypeError(f"regex must be a string, got {type(regex).__name__}")
        spec, field = ll.LLMatcher.grammar_from_regex(regex), "regex"
    else:
        if not isinstance(grammar, str):
            raise TypeError(f"grammar must be a string (Lark), got {type(grammar).__name__}")
        spec, field = ll.LLMatcher.grammar_from_lark(grammar), "grammar"
    error = ll.LLMatcher.validate_grammar(spec)  # "" when the grammar is sound
    if error:
        raise ValueError(f"{field}: {error.strip().splitlines()[0]}")
    return spec


def _schema_of(response_format):
    if response_format["type"] == "json_object":
        return {"type": "object"}
    inner = response_format.get("json_schema")
    if not isinstance(inner, dict):
        raise ValueError("response_format.json_schema must be an object with a 'schema'")
    schema = inner.get("schema", {})
    if isinstance(schema, str):
        schema = json.loads(schema)
    if not isinstance(schema, dict):
        raise ValueError("response_format.json_schema.schema must be a JSON object")
    return schema


class GrammarProcessor:
    """One row's constraint, a logits processor ``(tokens (T,), logits (1, V)) -> logits``.

    ``tokens`` is the row's whole context; the first call records its length (the
    prompt) and later calls feed the matcher only the tokens generated since. Tokens
    the grammar forbids get ``-inf``; once the grammar is complete only end-of-sequence
    tokens remain.
    """

    def __init__(self, tokenizer, spec):
        ll = _llguidance()
        self._lltok = grammar_tokenizer(tokenizer)
        self._matcher = ll.LLMatcher(self._lltok, spec)
        if self._matcher.is_error():
            raise ValueError(f"constraint: {self._matcher.get_error()}")
        self._eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
        self._mask = np.zeros((1, (self._lltok.vocab_size + 31) // 32), np.int32)
        self._seen = None

    def __call__(self, tokens, logits):
        n = int(tokens.shape[-1])
        if self._seen is None:
            self._seen = n
        elif n > self._seen:
            new = tokens[self._seen:].tolist()
            self._seen = n
            for t in new:
                if not self._matcher.consume_token(int(t)):
                    raise RuntimeError(f"constraint: token {t} rejected: {self._matcher.get_error()}")
        return logits + self.bias(logits.shape[-1])

    def bias(self, vocab):
        """``(1, vocab)`` additive mask: 0 where the grammar allows the token, else -inf."""
        import llguidance.numpy as lln

        lln.fill_next_token_bitmask(self._matcher, self._mask, 0)
        bits = np.unpackbits(self._mask.view(np.uint8), bitorder="little")[: self._lltok.vocab_size]
        allowed = np.zeros(vocab, bool)
        n = min(vocab, bits.size)
        allowed[:n] = bits[:n].astype(bool)
        if self._matcher.is_stopped() or allowed[self._lltok.eos_token]:
            allowed[[e for e in self._eos if e < vocab]] = True
        return mx.array(np.where(allowed, 0.0, -np.inf).astype(np.float32))[None]


def make_grammar_processor(tokenizer, response_format=None, regex=None, grammar=None
                           ) -> Optional[GrammarProcessor]:
    """A fresh per-row constraint processor for these fields, or None when they do not
    constrain (``response_format`` ``text`` or nothing given). Give each row its own."""
    spec = grammar_spec(response_format, regex, grammar)
    return None if spec is None else GrammarProcessor(tokenizer, spec)
