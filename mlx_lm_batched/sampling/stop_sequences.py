"""Stop sequences of token ids, matched one token at a time per row.

``StopSequences`` is built once from the sequences (an Aho-Corasick automaton: a
trie whose nodes also know the longest suffix of their path that is again a
prefix of some sequence, so a mismatch never rescans earlier tokens);
``matcher()`` gives one row its own position in it. The interface is mlx-lm's
(``StopSequences(...).matcher().advance(token) -> bool``); ``StopSequenceMatcher``
is the same automaton behind the interface of earlier mlx-lm 0.32 releases
(``make_state()`` and ``match(state, trie, token) -> (state, matched)``).
"""

from collections import deque


def _as_sequence(seq):
    """A stop sequence as a tuple of ints; a bare int is a one-token sequence."""
    if isinstance(seq, int) or hasattr(seq, "__index__"):
        return (int(seq),)
    return tuple(int(t) for t in seq)


class _Node:
    __slots__ = ("children", "fail", "match")

    def __init__(self):
        self.children = {}
        self.fail = None
        self.match = False  # some sequence ends here (or at a suffix of this path)


class StopSequences:
    """An immutable matcher of several token-id sequences; any match means stop.

    ``stop_sequences`` is an iterable of token-id sequences (a bare int counts as
    a one-token sequence); empty sequences are ignored.
    """

    class Matcher:
        """One stream's position in a :class:`StopSequences` automaton."""

        def __init__(self, root):
            self._root = root
            self._node = root

        def advance(self, token):
            """Consume one token; True when a stop sequence has just completed."""
            token = int(token)
            node = self._node
            while token not in node.children and node is not self._root:
                node = node.fail
            node = node.children.get(token, self._root)
            self._node = node
            return node.match

    def __init__(self, stop_sequences=None):
        self._root = _Node()
        self._root.fail = self._root
        # The sequences as given (tuples of ids): what a replaying rank rebuilds it from.
        self.sequences = tuple(s for s in map(_as_sequence, stop_sequences or ()) if s)
        for seq in self.sequences:
            node = self._root
            for token in seq:
                node = node.children.setdefault(token, _Node())
            node.match = True
        self._link()

    def _link(self):
        """Breadth-first: each node's failure link is the node of its longest proper
        suffix that is a trie path; a node matches if its failure node does."""
        queue = deque()
        for child in self._root.children.values():
            child.fail = self._root
            queue.append(child)
        while queue:
            node = queue.popleft()
            for token, child in node.children.items():
                fail = node.fail
                while token not in fail.children and fail is not self._root:
                    fail = fail.fail
                target = fail.children.get(token, self._root)
                child.fail = target if target is not child else self._root
                child.match = child.match or child.fail.match
                queue.append(child)

    def matcher(self):
        """A fresh matcher at the start of the automaton."""
        return self.Matcher(self._root)


class StopSequenceMatcher(StopSequences):
    """:class:`StopSequences` with the stateless interface of mlx-lm 0.32.0/0.32.1: the
    caller keeps each stream's state (a node) and passes the root back in."""

    def make_state(self):
        """A fresh stream state: the root of the automaton."""
        return self._root

    @staticmethod
    def match(state, trie, token):
        """Advance ``state`` by one token; returns ``(new_state, matched)``."""
        token = int(token)
        while token not in state.children and state is not trie:
            state = state.fail
        state = state.children.get(token, trie)
        return state, state.match


def make_stop_matcher(tokenizer, stop_words=None):
    """:func:`make_stop_sequences` as a :class:`StopSequenceMatcher` (older mlx-lm name)."""
    return StopSequenceMatcher(_token_sequences(tokenizer, stop_words))


def make_stop_sequences(tokenizer, stop_words=None):
    """Stop sequences for the tokenizer's EOS ids and the encodings of ``stop_words``."""
    return StopSequences(_token_sequences(tokenizer, stop_words))


def _token_sequences(tokenizer, stop_words):
    sequences = [(t,) for t in tokenizer.eos_token_ids]
    for word in stop_words or ():
        sequences.append(tuple(tokenizer.encode(word, add_special_tokens=False)))
    return sequences
