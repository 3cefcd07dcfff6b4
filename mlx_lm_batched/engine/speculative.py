"""Speculative decoding on one batch: a drafter proposes ``K`` tokens per row, the target
model scores them in one call, and each row keeps its own number of them.

A :class:`SpeculativeEngine` drives a target :class:`~.batch_engine.BatchEngine` and a
drafter (:class:`DraftModel`: a smaller model on its own ``BatchEngine``;
:class:`PromptLookup`: n-gram matches in the row's own tokens, no model). One ``step(y)``:

1. the drafter proposes ``d_1..d_K`` per row (the draft model is fed ``y, d_1..d_K``, so
   its cache then holds the same tokens as the target's);
2. the target is fed ``[y, d_1..d_K]`` as one ``(B, K + 1)`` call at each row's
   ``offset``: ``K + 1`` next-token distributions per row;
3. each row keeps ``n_b`` drafts (``sampling/rejection.py``: exact greedy matching, or
   rejection sampling) and one token of the target's after them;
4. both models' caches drop each row's ``K - n_b`` rejected slots
   (``PromptCache.rewind_rows``: the row moves right in the shared slot frame and its
   padding grows, so its ``offset`` and mask stay those of the row alone).

The engine has ``BatchEngine``'s interface (``start_prefill``, ``step``, ``filter``,
``extend``, ``extract_row``, ...), so ``BatchGenerator`` runs it as its decode batch;
``step`` returns ``(next tokens, their logprobs, kept)`` with ``kept[b]`` the row's
accepted drafts as ``(token, logprobs)`` pairs, which come before its next token.
"""

import mlx.core as mx

from ..layers.lora import adapter_rows
from ..models.context import model_vocab_size
from ..sampling.rejection import greedy_accept, rejection_accept
from ..sampling.samplers import BatchSampler, greedy_sampler
from .batch_engine import BatchEngine
from .sampling import RowSampling, SharedSampling, log_softmax


def check_num_draft_tokens(value):
    """``num_draft_tokens`` as an int >= 1 (``ValueError``/``TypeError`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"num_draft_tokens must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {value}")
    return value


def sampling_groups(sampling, rows):
    """``[(sampler, row indices)]`` of a target's sampling state; greedy rows use
    ``greedy_sampler``. Refuses what has no fixed distribution to accept against."""
    if isinstance(sampling, SharedSampling):
        if sampling.processors:
            raise NotImplementedError("logits_processors cannot be combined with speculative "
                                      "decoding yet: drop them or the draft model")
        pairs = [(sampling.sampler, list(range(rows)))]
    elif isinstance(sampling, RowSampling):
        if any(r.processors for r in sampling.rows):
            raise NotImplementedError("logits_processors cannot be combined with speculative "
                                      "decoding yet: drop them or the draft model")
        groups = {}
        for i, r in enumerate(sampling.rows):
            s = r.sampler or greedy_sampler
            groups.setdefault(id(s), (s, []))[1].append(i)
        pairs = list(groups.values())
    else:
        raise TypeError(f"unknown sampling state {type(sampling).__name__}")
    for s, _ in pairs:
        if s is not greedy_sampler and not isinstance(s, BatchSampler):
            raise ValueError("speculative decoding samples with make_sampler(...) samplers: "
                             "a custom sampler callable gives no distribution to accept "
                             "drafts against")
    return pairs


def _fit_vocab(logits, vocab):
    """Draft logits over the target's vocabulary (missing ids at -inf, extra ones cut)."""
    V = logits.shape[-1]
    if vocab is None:  # the model does not say: the draft's own vocabulary
        return logits
    if V > vocab:
        return logits[..., :vocab]
    if V < vocab:
        pad = mx.full((*logits.shape[:-1], vocab - V), -float("inf"), logits.dtype)
        return mx.concatenate([logits, pad], axis=-1)
    return logits


class DraftModel:
    """Drafts with a smaller model on its own ``BatchEngine`` (same tokenizer)."""

    def __init__(self, engine):
        self.engine = engine

    def start_prefill(self, tokens, padding, cuts=()):
        return self.engine.start_prefill(tokens, padding, cuts=cuts)

    def draft(self, y, k, groups, vocab):
        """``(B, k)`` drafts after ``y`` and the ``(B, k, V)`` probabilities each was drawn
        from (None for greedy groups, whose drafts are argmaxes)."""
        engine = self.engine
        tokens, drafts, probs = y, [], []
        sampled = any(s is not greedy_sampler for s, _ in groups)
        for i in range(k + 1):
            logits = engine.model(tokens[:, None], offset=engine.offset, cache=engine.cache)
            if i == k:  # fed d_K: the draft cache now holds what the target's will
                break
            logits = _fit_vocab(logits[:, -1, :].astype(mx.float32), vocab)
            tokens, q = _draw(logits, groups, sampled)
            drafts.append(tokens)
            probs.append(q)
        q = mx.stack(probs, axis=1) if sampled else None
        return mx.stack(drafts, axis=1), q

    def rewind(self, drop):
        self.engine.cache.rewind_rows(drop)
        self.engine.rows_changed()

    def record(self, emitted):
        """Nothing to record: the draft's cache holds its history."""

    def filter(self, keep):
        self.engine.filter(keep)

    def extend(self, other):
        self.engine.extend(other.engine)

    @property
    def nbytes(self):
        return self.engine.nbytes


def _draw(logits, groups, sampled):
    """Per group: greedy argmax, or a draw from the sampler's distribution. Returns
    ``(tokens (B,), probabilities (B, V) or None)``."""
    if not sampled:
        return mx.argmax(logits, axis=-1), None
    logprobs = log_softmax(logits)
    tokens = mx.zeros((logits.shape[0],), mx.int32)
    probs = mx.zeros(logits.shape, mx.float32)
    for s, idx in groups:
        rows = mx.array(idx, dtype=mx.int32)
        lp = logprobs[rows]
        if s is greedy_sampler:
            t = mx.argmax(lp, axis=-1)
            q = (mx.arange(lp.shape[-1])[None] == t[:, None]).astype(mx.float32)
        else:
            q = s.distribution(lp)
            t = mx.random.categorical(mx.log(q), key=s.next_key())
        tokens[rows] = t.astype(mx.int32)
        probs[rows] = q
    return tokens, probs


class PromptLookup:
    """Drafts by prompt lookup: the tokens that followed the latest earlier occurrence of
    the row's last ``n``-gram (``n`` from ``max_ngram`` down to 1) in its own tokens
    (its prompt and what it generated). No model, no cache; a row without a match
    proposes its last token repeated (rejected at no cost beyond the verify call)."""

    def __init__(self, max_ngram=3):
        self.max_ngram = max_ngram
        self.history = []  # per row: its tokens so far

    def start_prefill(self, tokens, padding, cuts=()):
        self.history = [row[p:] for row, p in zip(tokens.tolist(), padding)]
        return None

    def draft(self, y, k, groups, vocab):
        drafts = []
        for row, last in zip(self.history, y.tolist()):
            drafts.append(self._lookup(row + [last], k))
        return mx.array(drafts, dtype=mx.int32), None

    def _lookup(self, tokens, k):
        for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == tail:
                    found = tokens[start + n : start + n + k]
                    return found + [found[-1]] * (k - len(found))
        return [tokens[-1]] * k

    def rewind(self, drop):
        """Nothing to rewind: the history only holds kept tokens (``record``)."""

    def record(self, emitted):
        for row, tokens in zip(self.history, emitted):
            row.extend(tokens)

    def filter(self, keep):
        self.history = [self.history[i] for i in keep]

    def extend(self, other):
        self.history = self.history + other.history

    @property
    def nbytes(self):
        return 0


def make_drafter(draft_model, prompt_lookup, draft_cache=None, max_kv_size=None,
                 prefill_step_size=2048):
    """The drafter for ``draft_model`` (a model) or ``prompt_lookup`` (True: n-grams of
    the row's own tokens); ``ValueError`` when both or neither are given."""
    if (draft_model is None) == (not prompt_lookup):
        raise ValueError("speculative decoding takes either draft_model or prompt_lookup, "
                         "not both" if draft_model is not None else
                         "speculative decoding needs draft_model or prompt_lookup")
    if draft_model is None:
        return PromptLookup()
    return DraftModel(BatchEngine(draft_model, draft_cache, max_kv_size=max_kv_size,
                                  prefill_step_size=prefill_step_size))


class SpeculativePrefill:
    """The target's prefill job and the draft model's, advanced together; reads as the
    target's (``fed``, ``calls``, ...). ``result``: ``(tokens, logprobs, kept)`` of step
    one, ``kept`` empty per row (no drafts yet)."""

    def __init__(self, target_job, draft_job):
        self.target, self.draft = target_job, draft_job
        self.result = None

    @property
    def done(self):
        return self.result is not None

    def advance(self, token_budget=None):
        target_done = self.target.advance(token_budget)
        draft_done = self.draft is None or self.draft.advance(token_budget)
        if target_done and draft_done and self.result is None:
            y, logprobs = self.target.result
            self.result = (y, logprobs, [[] for _ in range(y.shape[0])])
        return self.done

    def run(self, progress=None):
        while not self.advance():
            if progress is not None:
                progress(*self.target.progress)
        return self.result

    def close(self):
        """Stop both jobs (``PrefillJob.close``: rows removed mid-prefill)."""
        self.target.close()
        if self.draft is not None:
            self.draft.close()

    fed = property(lambda self: self.target.fed)
    calls = property(lambda self: self.target.calls)
    progress = property(lambda self: self.target.progress)
    padding_tokens = property(lambda self: self.target.padding_tokens)
    scores = property(lambda self: self.target.scores)


class SpeculativeEngine:
    """A target ``BatchEngine`` with a drafter (:class:`DraftModel` or
    :class:`PromptLookup`) proposing ``num_draft_tokens`` tokens per row and step.

    Counts ``steps`` (verify calls) and ``drafted``/``accepted`` tokens (per live row)
    for measurements."""

    def __init__(self, target, drafter, num_draft_tokens=2):
        self.target = target
        self.drafter = drafter
        self.num_draft_tokens = check_num_draft_tokens(num_draft_tokens)
        self.vocab = model_vocab_size(target.model)
        self.steps = self.drafted = self.accepted = 0

    # BatchEngine's interface, read from the target
    model = property(lambda self: self.target.model)
    cache = property(lambda self: self.target.cache)
    sampling = property(lambda self: self.target.sampling)
    rows = property(lambda self: self.target.rows)
    offset = property(lambda self: self.target.offset)
    slots = property(lambda self: self.target.slots)

    @property
    def row_ids(self):
        return self.target.row_ids

    @property
    def nbytes(self):
        return self.target.nbytes + self.drafter.nbytes

    def reserve(self, new_tokens):
        # A verify call writes K + 1 slots before the rejected ones are dropped.
        ahead = new_tokens + self.num_draft_tokens + 1
        self.target.reserve(ahead)
        if isinstance(self.drafter, DraftModel):
            self.drafter.engine.reserve(ahead)

    def start_prefill(self, tokens, left_padding=None, input_embeddings=None, cuts=(), score=None):
        """Prefill both models on the ``(B, L)`` prompt (see ``BatchEngine.start_prefill``;
        the target's logits give the ``score`` rows' prompt log-probabilities)."""
        if input_embeddings is not None:
            raise NotImplementedError("input_embeddings cannot be combined with speculative "
                                      "decoding: the draft model needs token ids")
        pad = [0] * tokens.shape[0] if left_padding is None else list(left_padding)
        job = self.target.start_prefill(tokens, pad, cuts=cuts, score=score)
        return SpeculativePrefill(job, self.drafter.start_prefill(tokens, pad, cuts))

    def prefill(self, tokens, left_padding=None, progress=None, input_embeddings=None):
        return self.start_prefill(tokens, left_padding, input_embeddings).run(progress)

    def step(self, y):
        """Feed ``y`` ``(B,)`` with drafts; return ``(next (B,), next logprobs (B, V),
        kept)``: ``kept[b]`` lists row ``b``'s accepted drafts as ``(token, logprobs)``
        pairs (they come before its next token)."""
        target, K = self.target, self.num_draft_tokens
        B = y.shape[0]
        groups = sampling_groups(target.sampling, B)
        vocab = self.vocab
        drafts, q = self.drafter.draft(y, K, groups, vocab)
        feed = mx.concatenate([y[:, None].astype(mx.int32), drafts.astype(mx.int32)], axis=1)
        with adapter_rows(target.adapter_slots()):
            logits = target.model(feed, offset=target.offset, cache=target.cache)
        logits = logits.astype(mx.float32)
        if vocab is None:
            vocab = logits.shape[-1]
        kept = mx.zeros((B,), mx.int32)
        nxt = mx.zeros((B,), mx.int32)
        for s, idx in groups:
            rows = mx.array(idx, dtype=mx.int32)
            if s is greedy_sampler:
                n, t = greedy_accept(logits[rows], drafts[rows])
            else:
                p = mx.stack([s.distribution(log_softmax(logits[rows, j]))
                              for j in range(K + 1)], axis=1)
                n, t = rejection_accept(p, None if q is None else q[rows], drafts[rows],
                                        key=s.next_key())
            kept[rows] = n.astype(mx.int32)
            nxt[rows] = t.astype(mx.int32)
        want = getattr(target.sampling, "want_logprobs", True)
        logprobs = log_softmax(logits) if want else None
        mx.eval(kept, nxt, drafts)
        n_kept = kept.tolist()
        drop = [K - n for n in n_kept]
        target.cache.rewind_rows(drop)
        target.rows_changed()
        self.drafter.rewind(drop)
        rows_drafts = drafts.tolist()
        out = [[(rows_drafts[b][j], None if logprobs is None else logprobs[b, j])
                for j in range(n_kept[b])] for b in range(B)]
        self.drafter.record([[int(v)] + rows_drafts[b][: n_kept[b]]
                             for b, v in enumerate(y.tolist())])
        self.steps += 1
        self.drafted += K * B
        self.accepted += sum(n_kept)
        if logprobs is None:
            return nxt, None, out
        idx = mx.array(n_kept, dtype=mx.int32)[:, None, None]
        return nxt, mx.take_along_axis(logprobs, idx, axis=1)[:, 0], out

    def rows_changed(self):
        self.target.rows_changed()

    def extract_row(self, row, views=False):
        return self.target.extract_row(row, views)

    def filter(self, keep):
        self.target.filter(keep)
        self.drafter.filter(keep)

    def extend(self, other):
        self.target.extend(other.target)
        self.drafter.extend(other.drafter)
