"""Print the table of supported architectures (docs/models.md), generated from the registry.

`python scripts/arch_table.py` prints it, `python scripts/update_arch_table.py` writes it
into docs/models.md, and `tests/test_readme.py` checks that docs/models.md holds exactly this
table, so the two cannot drift.
"""

import importlib
import sys

from mlx_lm_batched.models import MODEL_TYPES, supported_model_types


def uses_experts(module_name, seen=None):
    """True when the module (or a family module it builds on) uses layers/moe.py."""
    seen = set() if seen is None else seen
    seen.add(module_name)
    module = importlib.import_module(f"mlx_lm_batched.models.{module_name}")
    for value in vars(module).values():
        origin = getattr(value, "__module__", None) or getattr(value, "__name__", "")
        if origin == "mlx_lm_batched.layers.moe":
            return True
        if not origin.startswith("mlx_lm_batched.models."):
            continue
        name = origin.rsplit(".", 1)[1]
        if name in MODEL_TYPES.values() and name not in seen and uses_experts(name, seen):
            return True
    return False


def table():
    """The markdown table: one row per supported ``model_type``."""
    rows = ["| model_type | module | mixture of experts |", "|---|---|---|"]
    for model_type in supported_model_types():
        module = MODEL_TYPES[model_type]
        rows.append(f"| `{model_type}` | `models/{module}.py` | {'yes' if uses_experts(module) else ''} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
