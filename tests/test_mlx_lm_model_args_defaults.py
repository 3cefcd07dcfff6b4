"""``ModelArgs`` built with few fields, as mlx-lm's own code and tests build them: the
sizes a config leaves out take mlx-lm 0.32's defaults, and the model built from them
has mlx-lm's parameter names and shapes (mlx-lm is the oracle, imported here only).

Fields whose transformers default differs from mlx-lm's (RoPE base, Phi's rotary
fraction) keep transformers': a checkpoint saved by transformers omits the fields
equal to its defaults, so that is what an absent field means there."""

import importlib

import pytest
from mlx.utils import tree_flatten

from mlx_lm_batched.loading.mlx_lm_layout import mlx_lm_weights

# family -> the keyword arguments mlx-lm's tests pass (the rest are defaults)
FEW_FIELDS = {
    "cohere": {"model_type": "cohere"},
    "cohere2": {"model_type": "cohere2", "hidden_size": 4096, "head_dim": 128,
                "num_hidden_layers": 40, "sliding_window": 4096,
                "sliding_window_pattern": 4},
    "phi": {},
    "starcoder2": {"model_type": "starcoder2", "hidden_size": 1024, "num_hidden_layers": 4,
                   "intermediate_size": 2048, "num_attention_heads": 4,
                   "num_key_value_heads": 4},
}
# intermediate_size is not among them: left out, it is 4 x hidden_size here (the rule of
# transformers' families that derive it), where mlx-lm has a constant that ignores the width.
SIZES = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "vocab_size")


def _args(package, family, fields):
    return importlib.import_module(f"{package}.models.{family}").ModelArgs(**fields)


@pytest.mark.parametrize("family", sorted(FEW_FIELDS))
def test_defaults_match_mlx_lm(family):
    theirs = _args("mlx_lm", family, FEW_FIELDS[family])
    ours = _args("mlx_lm_batched", family, FEW_FIELDS[family])
    for name in SIZES:
        assert getattr(ours, name) == getattr(theirs, name), name


@pytest.mark.parametrize("family", sorted(FEW_FIELDS))
def test_model_from_few_fields_has_mlx_lm_parameters(family):
    """The same parameters (under the names this package saves for mlx-lm) and shapes
    as mlx-lm's model from the same fields (built lazily: nothing is allocated for the
    full-size defaults)."""
    fields = dict(FEW_FIELDS[family], num_hidden_layers=2)
    fields.setdefault("intermediate_size", _args("mlx_lm", family, fields).intermediate_size)
    shapes = []
    for package in ("mlx_lm", "mlx_lm_batched"):
        module = importlib.import_module(f"{package}.models.{family}")
        weights = dict(tree_flatten(module.Model(module.ModelArgs(**fields)).parameters()))
        if package == "mlx_lm_batched":
            weights = mlx_lm_weights(family, weights)
        shapes.append({k: tuple(v.shape) for k, v in weights.items()})
    assert shapes[1] == shapes[0]
