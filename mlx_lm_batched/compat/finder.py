"""The import hook that serves mlx-lm's module paths from ``module_table``.

Python finds a module by a file or by a finder on ``sys.meta_path``. The paths that code
written for mlx-lm imports hold no code of their own (about forty: ``utils``,
``models.cache``, one per model_type that another family serves, four of them hyphenated
and so unspellable in an import statement), so one finder generates each from its table
row instead of a file per row, and refuses mlx-lm's modules this package does not have
with one line. It sits last on ``sys.meta_path``: a real file always wins, and it answers
only for names under ``mlx_lm_batched`` that the table lists. The command modules
(``generate``, ``chat`` ...) stay files, which is what ``python -m`` runs.
"""

import importlib.abc
import importlib.util
import sys

from . import module_table
from .reexport import export_names, relative_path

ORIGIN = "mlx_lm_batched/compat/module_table.py"


class MlxLmPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finder and loader of the table's module paths (see the module docstring)."""

    def find_spec(self, fullname, path=None, target=None):
        """A spec for a path the table lists (or refuses), else None."""
        rel = relative_path(fullname)
        if rel is None or (rel not in module_table.REFUSED
                           and module_table.sources(rel) is None):
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=ORIGIN,
                                               is_package=rel in module_table.PACKAGES)

    def create_module(self, spec):
        return None  # a plain module object

    def exec_module(self, module):
        """Fill the module from its row; raise the refusal line for a refused one."""
        rel = relative_path(module.__name__)
        message = module_table.REFUSED.get(rel)
        if message is not None:
            # ``python -m mlx_lm_batched.quant.awq``: runpy imports the parent first,
            # while sys.argv[0] is still "-m"; the line alone, not a traceback.
            if sys.argv[:1] == ["-m"]:
                sys.exit(message)
            raise ImportError(message)
        modules = ", ".join(f"``{m}``" for m in module_table.sources(rel))
        module.__doc__ = (f"mlx-lm's ``mlx_lm.{rel}``: names defined in {modules}." if modules
                          else f"mlx-lm's package ``mlx_lm.{rel}``: its modules only.")
        module.__all__ = export_names(vars(module))

    def get_code(self, fullname):
        """What ``python -m`` runs: a refused module's line and exit status 1; nothing
        for the others (importing them is all they do)."""
        message = module_table.REFUSED.get(relative_path(fullname))
        source = "" if message is None else f"import sys\nsys.exit({message!r})\n"
        return compile(source, f"<{fullname}>", "exec")


def install():
    """Put the finder last on ``sys.meta_path``, once per process."""
    if not any(isinstance(f, MlxLmPathFinder) for f in sys.meta_path):
        sys.meta_path.append(MlxLmPathFinder())
