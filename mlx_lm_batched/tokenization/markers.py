"""Reasoning and structural markers a tokenizer's vocabulary implies (mlx-lm's
``TokenizerWrapper.think_start`` / ``think_end`` / ``structural_markers``).

Single-token pairs are looked up in the vocabulary first; then the multi-token
conventions (Gemma 4's thought channel, the XTML-style ``<|open|>...<|sep|>`` markup),
whose token ids are what the tokenizer encodes the marker text to.
"""

from .._reasoning_markers import GEMMA4_CHANNEL_TOKENS, GEMMA4_THOUGHT, SINGLE_TOKEN_THINK

XTML_TOKENS = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")


def is_xtml_vocab(vocab):
    """True for vocabularies of the ``<|open|>name<|sep|> ... <|close|>`` markup."""
    return all(t in vocab for t in XTML_TOKENS)


def infer_thinking(tokenizer, vocab):
    """``(start, end, start_ids, end_ids)`` of the tokenizer's reasoning block, or four
    Nones when its vocabulary has none."""
    for start, end in SINGLE_TOKEN_THINK:
        if start in vocab and end in vocab:
            return start, end, (vocab[start],), (vocab[end],)
    if all(t in vocab for t in GEMMA4_CHANNEL_TOKENS):
        pair = GEMMA4_THOUGHT
    elif is_xtml_vocab(vocab):
        pair = ("<|open|>think<|sep|>", "<|close|>think<|sep|>")
    else:
        return None, None, None, None
    ids = [tuple(tokenizer.encode(text, add_special_tokens=False)) for text in pair]
    return pair[0], pair[1], ids[0], ids[1]


def infer_structural_markers(vocab):
    """Marker strings that delimit a response without changing its state (XTML's)."""
    if is_xtml_vocab(vocab):
        return ("<|open|>response<|sep|>", "<|close|>response<|sep|>",
                "<|close|>message<|sep|>")
    return ()


def find_sequence(tokens, sequence, start=None, end=None, reverse=False):
    """Index of the first (``reverse``: last) occurrence of ``sequence`` in
    ``tokens[start:end]``, or -1."""
    if not sequence:
        return -1
    start = max(start or 0, 0)
    end = len(tokens) if end is None else end
    n = len(sequence)
    positions = range(start, end - n + 1)
    for i in (reversed(positions) if reverse else positions):
        if tuple(tokens[i:i + n]) == tuple(sequence):
            return i
    return -1
