"""mlx-lm's ``PromptTrie``: values stored under (model, token sequence), searched for
the exact sequence, the longest stored prefix of it and the shortest stored extension
of its longest common prefix (what a prompt cache server reuses)."""

from dataclasses import dataclass
from typing import Any, List, Optional

_VALUE = object()  # the key of a node's value: no token can equal it


@dataclass
class PromptTrieResult:
    """A search's answer: ``exact`` (the tokens, when stored), ``shorter`` (the longest
    stored proper prefix, of two tokens or more, as mlx-lm counts it), ``longer`` (the
    shortest stored sequence through the deepest node reached) and ``common_prefix``
    (how many tokens matched a stored path)."""

    model: Any
    exact: Optional[List[int]]
    shorter: Optional[List[int]]
    longer: Optional[List[int]]
    common_prefix: int


class PromptTrie:
    """A trie per model of token sequences with a value at each stored sequence."""

    def __init__(self):
        self._roots = {}

    def _node(self, model, tokens):
        node = self._roots[model]
        for tok in tokens:
            node = node[tok]
        return node

    def add(self, model, tokens, value):
        """Store ``value`` under ``tokens``; return the value it replaces (or None)."""
        node = self._roots.setdefault(model, {})
        for tok in tokens:
            node = node.setdefault(tok, {})
        previous = node.get(_VALUE)
        node[_VALUE] = value
        return previous

    def get(self, model, tokens):
        """The value stored under ``tokens`` (KeyError when there is none)."""
        return self._node(model, tokens)[_VALUE]

    def pop(self, model, tokens):
        """Remove and return the value under ``tokens``, pruning emptied nodes."""
        path = [self._roots[model]]
        for tok in tokens:
            path.append(path[-1][tok])
        value = path[-1].pop(_VALUE)
        for depth in range(len(tokens), 0, -1):
            if path[depth]:
                break
            del path[depth - 1][tokens[depth - 1]]
        return value

    def pop_prefixes(self, model, tokens):
        """Remove the values stored under proper prefixes of ``tokens``; return them as
        ``(prefix length, value)`` pairs, shortest first."""
        found, node = [], self._roots[model]
        for i, tok in enumerate(tokens):
            if _VALUE in node:
                found.append((i, node.pop(_VALUE)))
            node = node[tok]
        return found

    def search(self, model, tokens):
        """Where ``tokens`` meets the stored sequences (a :class:`PromptTrieResult`)."""
        if model not in self._roots:
            return PromptTrieResult(model, None, None, None, 0)
        node = self._roots[model]
        if not tokens and _VALUE in node:
            return PromptTrieResult(model, [], None, None, 0)
        depth, last_value = 0, -1
        while depth < len(tokens) and tokens[depth] in node:
            node = node[tokens[depth]]
            if _VALUE in node:
                last_value = depth
            depth += 1
        if len(tokens) > 0 and last_value == len(tokens) - 1:
            return PromptTrieResult(model, tokens, None, None, 0)
        shorter = tokens[: last_value + 1] if last_value > 0 else None
        longer = None
        if depth > 0:
            longer = list(tokens[:depth]) + self._nearest_value(node)
        return PromptTrieResult(model, None, shorter, longer, depth)

    @staticmethod
    def _nearest_value(node):
        """The shortest token path below ``node`` to a stored value (breadth first;
        among equally short paths, the last one reached in insertion order, as mlx-lm's
        depth-first walk picks it)."""
        level = [(node, [])]
        while level:
            hits = [extra for n, extra in level if _VALUE in n]
            if hits:
                return hits[-1]
            level = [(child, extra + [tok]) for n, extra in level
                     for tok, child in n.items() if tok is not _VALUE]
        return []
