"""Mask time per token of candidate grammar engines on the test fixtures' tokenizers.

Walks a valid JSON document for a nested schema token by token and times, at each
step, building the allowed-token mask and advancing the matcher. Used to choose the
grammar engine (see CHANGELOG). Run: python scripts/bench_grammar_mask.py DIR [DIR...]
"""

import json
import sys
import time

import numpy as np
from transformers import PreTrainedTokenizerFast

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}
DOC = json.dumps({"name": "Ada Lovelace", "age": 36, "tags": ["a", "ccc", "bb"],
                  "address": {"city": "London", "zip": "W1 2AB"}})


def bench_llguidance(hf, ids):
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    t0 = time.perf_counter()
    tok = llguidance.hf.from_tokenizer(hf)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    m = llguidance.LLMatcher(tok, grammar)
    setup = time.perf_counter() - t0
    mask = llguidance.numpy.allocate_token_bitmask(1, tok.vocab_size)
    times = []
    for t in ids:
        s = time.perf_counter()
        llguidance.numpy.fill_next_token_bitmask(m, mask, 0)
        assert m.consume_token(t), m.get_error()
        times.append(time.perf_counter() - s)
    return setup, times


def bench_xgrammar(hf, ids):
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    m = xgr.GrammarMatcher(compiled)
    setup = time.perf_counter() - t0
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for t in ids:
        s = time.perf_counter()
        m.fill_next_token_bitmask(mask)
        assert m.accept_token(t)
        times.append(time.perf_counter() - s)
    return setup, times


def bench_outlines(hf, ids, path):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    vocab = Vocabulary.from_pretrained(path) if False else None
    # outlines-core builds its vocabulary from HF hub names; from a local tokenizer:
    eos = hf.eos_token_id
    table = {}
    for tok, i in hf.get_vocab().items():
        if i != eos:
            table.setdefault(hf.convert_tokens_to_string([tok]), []).append(i)
    vocab = Vocabulary(eos, table)
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), vocab)
    guide = Guide(index)
    setup = time.perf_counter() - t0
    times = []
    for t in ids:
        s = time.perf_counter()
        allowed = guide.get_tokens()
        np.zeros(len(hf), bool)[allowed] = True
        guide.advance(t)
        times.append(time.perf_counter() - s)
    return setup, times


def main(dirs):
    for path in dirs:
        hf = PreTrainedTokenizerFast(tokenizer_file=f"{path}/tokenizer.json")
        ids = hf.encode(DOC, add_special_tokens=False)
        for name, fn in [("llguidance", lambda: bench_llguidance(hf, ids)),
                         ("xgrammar", lambda: bench_xgrammar(hf, ids)),
                         ("outlines-core", lambda: bench_outlines(hf, ids, path))]:
            try:
                setup, times = fn()
            except Exception as e:  # report, keep measuring the others
                print(f"{path.split('/')[-1]:40s} {name:14s} failed: {type(e).__name__}: {e}"[:200])
                continue
            ms = np.array(times) * 1e3
            print(f"{path.split('/')[-1]:40s} {name:14s} vocab {len(hf):6d} setup {setup*1e3:8.1f} ms"
                  f"  mask+advance per token: mean {ms.mean():.3f} ms  p50 {np.median(ms):.3f}"
                  f"  max {ms.max():.3f} ms  ({len(ids)} tokens)")


if __name__ == "__main__":
    main(sys.argv[1:])
