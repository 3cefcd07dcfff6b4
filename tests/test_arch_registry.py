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


def _installed_mlx_lm_model_types():
    """Every model_type the installed mlx-lm serves: its architecture modules (those that
    define or re-export a ``Model``) plus its remapped type names."""
    import pkgutil
    import re
    from pathlib import Path

    import mlx_lm.models
    import mlx_lm.utils

    # Read, not imported: some modules exit on import without their optional package.
    defines_model = re.compile(r"^(class Model\(|from \.\w+ import .*\bModel\b)", re.M)
    types = set()
    for info in pkgutil.iter_modules(mlx_lm.models.__path__):
        source = Path(mlx_lm.models.__path__[0], f"{info.name}.py").read_text(encoding="utf-8")
        if defines_model.search(source) and "ModelArgs" in source:
            types.add(info.name.replace("_", "-") if info.name in _HYPHENATED else info.name)
    types |= set(mlx_lm.utils.MODEL_REMAPPING)
    types |= {model_type for model_type, _ in mlx_lm.utils.MODEL_ARCHITECTURE_REMAPPING}
    return types


# mlx-lm names these modules with underscores but their config's model_type has a hyphen.
_HYPHENATED = {"lfm2_vl", "lille_130m", "nemotron_nas"}


# mlx-lm model_types with no module here yet (empty: every type of mlx-lm 0.32.2 has one);
# the test below fails when a listed one gains a module, so the list stays true.
NOT_YET = set()


def test_every_model_type_of_the_installed_mlx_lm_resolves_here():
    # The next mlx-lm release shows up as this failing test, not as a user's bug report.
    from mlx_lm_batched.models import MODEL_TYPES

    served = _installed_mlx_lm_model_types()
    missing = sorted(served - set(MODEL_TYPES) - NOT_YET)
    assert not missing, f"mlx-lm model_types without a module here: {missing}"
    done = sorted(NOT_YET & set(MODEL_TYPES))
    assert not done, f"remove from NOT_YET (they have modules now): {done}"
    assert len(served) > 100  # the scan found mlx-lm's modules
