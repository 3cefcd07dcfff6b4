"""List the package's public functions and methods that take more than ``--max`` (8)
parameters, read from the source with ``ast`` (nothing is imported).

A parameter is a named one (positional or keyword-only; ``self`` / ``cls`` of a method
and ``*args`` / ``**kwargs`` not counted). Public: the name and its class's name do not
start with ``_`` (``__init__`` of a public class counts: it is the class's call, model
and layer classes included: their variant switches come in named parts such as
``layers/attention_options.py``'s). Left out: mlx-lm's own signatures, kept as its
callers know them (``MLX_LM_SIGNATURES``; ``YarnRoPE`` is ``mlx_lm.models.rope_utils``'s
class).

``python scripts/count_parameters.py`` prints one line per function
(``parameters path:line qualified.name``) and the count last; ``--count`` prints the
count alone; ``--max N`` changes the bound; ``--package DIR`` reads another folder.
"""

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mlx_lm_batched"

# mlx-lm 0.32's public signatures, kept parameter for parameter (mlx-lm's callers pass
# them positionally; ours may add keywords at the end): path -> qualified names.
MLX_LM_SIGNATURES = {
    "api/batch.py": {"batch_generate"},
    "api/generate.py": {"generate_step"},
    "api/speculative.py": {"speculative_generate_step"},
    "sched/generator.py": {"BatchGenerator.insert", "BatchGenerator.insert_segments"},
    "loading/load.py": {"load"},
    "loading/convert.py": {"convert"},
    "compat/models_gated_delta.py": {"gated_delta_update"},
    "compat/models_ssm.py": {"ssm_attn", "ssm_update", "ssm_update_kernel"},
    "layers/rope_classes.py": {"YarnRoPE.__init__"},
}


def parameter_count(fn, method):
    """Named parameters of ``fn`` (an ``ast.FunctionDef``), ``self``/``cls`` aside."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    if method and names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names)


def public_functions(tree):
    """``(qualified name, node, is method)`` of every public function and method."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not node.name.startswith("_"):
                yield node.name, node, False
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if (isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and (not item.name.startswith("_") or item.name == "__init__")):
                    static = any(isinstance(d, ast.Name) and d.id == "staticmethod"
                                 for d in item.decorator_list)
                    yield f"{node.name}.{item.name}", item, not static


def long_signatures(package=PACKAGE, bound=8):
    """``(parameters, relative path, line, qualified name)`` of each public function of
    ``package`` with more than ``bound`` parameters, sorted by path and line."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        kept = MLX_LM_SIGNATURES.get(rel, set())
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node, method in public_functions(tree):
            n = parameter_count(node, method)
            if n > bound and name not in kept:
                found.append((n, rel, node.lineno, name))
    return sorted(found, key=lambda f: (f[1], f[2]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max", type=int, default=8, help="parameters allowed (default 8)")
    p.add_argument("--count", action="store_true", help="print the count only")
    p.add_argument("--package", type=Path, default=PACKAGE,
                   help="the package folder to read (default: mlx_lm_batched)")
    args = p.parse_args(argv)
    found = long_signatures(args.package, args.max)
    if not args.count:
        for n, rel, line, name in found:
            print(f"{n:3d} {rel}:{line} {name}")
    print(len(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
