"""Which features do not combine: ONE table, and the one-line refusal of each entry.

Every entry point (the Python API, the command lines, the server and its requests)
names the features a call uses and asks :func:`conflict` / :func:`check` here, instead
of writing its own ``if a and b: raise``. A refusal names the features the way the
caller's user wrote them: ``surface`` "python" (keywords), "cli" (flags) or "http" (a
request's fields against the server's flags).
"""

from dataclasses import dataclass

SURFACES = ("python", "cli", "http")

# Feature -> how each surface names it (a surface left out uses the Python name).
NAMES = {
    "draft_model": {"python": "draft_model", "cli": "--draft-model"},
    "prompt_lookup": {"python": "prompt_lookup", "cli": "--prompt-lookup"},
    "speculative": {"python": "speculative decoding (draft_model, prompt_lookup)",
                    "cli": "--draft-model/--prompt-lookup",
                    "http": "this server's speculative decoding"},
    "kv_bits": {"python": "a quantized KV cache (kv_bits)", "cli": "--kv-bits"},
    "logits_processors": {"python": "logits_processors", "cli": "logits processors",
                          "http": "logit_bias and the penalties"},
    "adapters": {"python": "adapters", "cli": "--adapters/--adapter-path"},
    # A command line run on a distributed group (every rank runs the same batch).
    "distributed": {"python": "a distributed group", "cli": "--distributed"},
    # A tensor-parallel server: rank 0 records the generator's operations and the other
    # ranks replay them (server/replay.py).
    "distributed_serving": {"python": "a tensor-parallel server", "cli": "--distributed",
                            "http": "this server's distributed mode"},
    "prompt_scoring": {"python": "prompt_logprobs", "cli": "prompt scoring",
                       "http": "'echo' with 'logprobs'"},
}


@dataclass(frozen=True)
class Conflict:
    """Features that do not combine. ``text`` is the refusal with ``{feature}``
    placeholders; ``error`` the exception the Python API raises; ``param`` and ``code``
    the request field and error code of the HTTP refusal."""

    features: frozenset
    text: str
    error: type = ValueError
    param: str = None
    code: str = "unsupported_parameter"

    def message(self, surface="python"):
        """The one-line refusal with the features named as ``surface`` names them."""
        if surface not in SURFACES:
            raise ValueError(f"surface must be one of {', '.join(SURFACES)}, got {surface!r}")
        return self.text.format(**{f: NAMES[f].get(surface, NAMES[f]["python"])
                                   for f in NAMES})


def _conflict(features, text, **kw):
    return Conflict(frozenset(features), text, **kw)


CONFLICTS = (
    _conflict({"draft_model", "prompt_lookup"},
              "{draft_model} and {prompt_lookup} are two ways to draft: pass one, not both"),
    _conflict({"speculative", "kv_bits"},
              "{speculative} cannot be combined with {kv_bits} yet: quantized caches cannot "
              "rewind rows; drop one of them", error=NotImplementedError),
    _conflict({"speculative", "logits_processors"},
              "{logits_processors} cannot be combined with {speculative} yet: drop them or "
              "the draft model", error=NotImplementedError, param="logit_bias",
              code="invalid_request"),
    _conflict({"draft_model", "distributed"},
              "{draft_model} cannot be combined with {distributed} yet",
              error=NotImplementedError),
    _conflict({"speculative", "distributed_serving"},
              "{speculative} cannot be combined with {distributed_serving} yet",
              error=NotImplementedError),
    _conflict({"adapters", "distributed_serving"},
              "{adapters} cannot be combined with {distributed_serving} yet",
              error=NotImplementedError),
    # Scoring a prompt evaluates logits on rank 0 alone, which the other ranks' replay of
    # the same prefill does not do (a tensor-parallel head would wait for them).
    _conflict({"prompt_scoring", "distributed_serving"},
              "{prompt_scoring} cannot be combined with {distributed_serving} yet",
              error=NotImplementedError, param="echo"),
)


def speculative_features(draft_model=None, prompt_lookup=False):
    """The feature names of speculative decoding with these settings (empty: none)."""
    names = set()
    if draft_model is not None and draft_model is not False:
        names.add("draft_model")
    if prompt_lookup:
        names.add("prompt_lookup")
    return names | ({"speculative"} if names else set())


def conflict(features):
    """The first :class:`Conflict` of ``CONFLICTS`` that ``features`` (names) hold, or None."""
    features = set(features)
    unknown = features - set(NAMES)
    if unknown:
        raise ValueError(f"unknown feature(s): {', '.join(sorted(unknown))}")
    return next((c for c in CONFLICTS if c.features <= features), None)


def refusal(features, surface="python"):
    """The one-line refusal of the first conflict in ``features``, or None."""
    found = conflict(features)
    return None if found is None else found.message(surface)


def check(features):
    """Raise the first conflict's error (its Python refusal) when ``features`` hold one."""
    found = conflict(features)
    if found is not None:
        raise found.error(found.message("python"))
