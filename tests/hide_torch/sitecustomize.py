"""Loaded by a subprocess whose PYTHONPATH starts with this folder: torch looks
uninstalled, as after a plain ``pip install`` of the package (torch is a test oracle only).

The import system's path finder is swapped for one that finds neither the ``torch``
module nor its distribution metadata, which is what transformers checks. Without it,
transformers 5 imports torch whenever it is installed (``AutoTokenizer`` ->
``configuration_utils`` -> ``modeling_rope_utils``), 3.5-5 s per subprocess here.
"""

import sys
from importlib.machinery import PathFinder


class _NoTorch(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            return None
        return super().find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        return (d for d in super().find_distributions(*args, **kwargs)
                if (d.metadata["Name"] or "").lower() != "torch")


sys.meta_path[:] = [_NoTorch if f is PathFinder else f for f in sys.meta_path]
