"""Requests that wait for a running row to prefill the prefix they share with it.

Conversations that open with the same long system prompt often arrive together, before
any of them has left the prompt's blocks in the KV block store (``cache/kv_blocks.py``).
Prefilled side by side, each would compute the whole prefix and hold a dense copy of it:
16 conversations on a 1,800-token prompt compute 16 x 1,800 tokens and hold 16 copies.

Here the first such request leads: its rows run, and as soon as one of them has
prefilled its prompt, the engine stores the prompt's full blocks. A later request whose
prompt continues at least :data:`MIN_SHARED_BLOCKS` blocks of a leader's chain beyond
what the store holds waits for that leader; then it starts on the stored blocks (read
in place, ``row_blocks.py``) and prefills only its own tokens. If the leader leaves
before that (cancelled, failed), its followers start as they are.

Only for a block store (plain float KV models); the whole-cache LRU has no chain to
compare.
"""

MIN_SHARED_BLOCKS = 2  # a shorter shared run is not worth a wait


class PrefixLeaders:
    """Rows prefilling prompts others share (``uid -> chain keys``) and the requests
    waiting for each (``uid -> [item, ...]``; an item is whatever the engine needs to
    start the request later)."""

    def __init__(self, prefix_cache):
        self.store = getattr(prefix_cache, "store", None)
        self._chains = {}  # leader uid -> set of the block keys its prompt computes
        self._followers = {}  # leader uid -> items waiting for it

    def _missing(self, prompt, adapter):
        """Keys of the full blocks of ``prompt`` after the run the store holds (the last
        token always stays to compute, as in ``BlockStore.lookup``)."""
        keys, held = self.store.held_run(prompt, adapter)
        return keys[held:]

    def leader_for(self, prompts, adapter=0):
        """The uid of a leading row that computes at least ``MIN_SHARED_BLOCKS`` blocks
        one of ``prompts`` lacks, or None."""
        if self.store is None or not self._chains:
            return None
        for prompt in prompts:
            wanted = self._missing(prompt, adapter)[:MIN_SHARED_BLOCKS]
            if len(wanted) < MIN_SHARED_BLOCKS:
                continue
            for uid, chain in self._chains.items():
                # Keys name a block and all before it: shared keys are a leading run.
                if all(k in chain for k in wanted):
                    return uid
        return None

    def follow(self, uid, item):
        """``item`` waits for leader ``uid``."""
        self._followers.setdefault(uid, []).append(item)

    def lead(self, uid, prompt, adapter=0):
        """Row ``uid`` prefills ``prompt`` (all of it, on adapter slot ``adapter``): it
        leads when it computes at least ``MIN_SHARED_BLOCKS`` blocks the store lacks.
        Returns whether it leads."""
        if self.store is None:
            return False
        missing = self._missing(prompt, adapter)
        if len(missing) < MIN_SHARED_BLOCKS:
            return False
        self._chains[uid] = set(missing)
        return True

    def leads(self, uid):
        return uid in self._chains

    def done(self, uid):
        """Row ``uid`` stored its prompt's blocks, or left: the items that waited for it
        (to start now, oldest first)."""
        self._chains.pop(uid, None)
        return self._followers.pop(uid, [])

    def leave_all(self):
        """Every leader left (the batch failed): all waiting items, oldest leader first."""
        items = [item for uid in list(self._chains) for item in self.done(uid)]
        return items + [item for uid in list(self._followers) for item in self.done(uid)]

    @property
    def waiting(self):
        """Requests waiting for a leader."""
        return sum(len(v) for v in self._followers.values())
