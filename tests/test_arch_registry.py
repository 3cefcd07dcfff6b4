"""The architecture test table is driven by the registry: every registered
model_type must have a parity entry in some ``tests/test_arch*.py`` ``FAMILIES``."""

from arch_harness import collect_families, family_model_type
from mlx_lm_batched.models import MODEL_TYPES, get_model_module


def test_every_registered_model_type_has_a_parity_entry():
    covered = {family_model_type(name, entry) for name, (_, entry) in collect_families().items()}
    missing = sorted(set(MODEL_TYPES) - covered)
    assert not missing, f"model_types without a FAMILIES entry in tests/test_arch*.py: {missing}"


def test_every_parity_entry_names_a_registered_model_type():
    for name, (module, entry) in collect_families().items():
        model_type = family_model_type(name, entry)
        assert model_type in MODEL_TYPES, f"{module}: entry '{name}' covers unknown '{model_type}'"
        get_model_module(model_type)  # the module imports
