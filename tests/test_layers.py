"""The package's layering: subpackages named after their layer, imports flowing one way
(import-linter's contract in pyproject.toml, imports inside functions included), no
import cycle, and mlx-lm's module names kept as thin re-exports."""

import ast
import importlib
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

from mlx_lm_batched.models import MODEL_TYPES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mlx_lm_batched"
CONTRACT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
# Registered model_types served by another family's file get a module of their own name
# (mlx-lm's ``models.<type>`` names, hyphenated ones included, e.g. ``lfm2-vl``); each is a
# thin re-export of the family's module.
ALIAS_MODULES = sorted(t for t, m in MODEL_TYPES.items() if t != m)
# mlx-lm's module names: explicit re-exports and nothing else (generate and convert also
# start their command lines under ``python -m``).
SHIMS = ["generate", "utils", "sample_utils", "tokenizer_utils", "convert", "gguf",
         "generate_utils", "demo_models", "models/base", "models/cache", "models/ssm",
         "models/gated_delta", "models/mla", "models/rope_utils", "models/switch_layers",
         "models/activations", "chat", "cache_prompt", "benchmark", "run_batch", "fuse"] + [
             f"models/{t}" for t in ALIAS_MODULES]


def layer_modules():
    (contract,) = CONTRACT["contracts"]
    return [m.strip() for layer in contract["layers"] for m in layer.split("|")]


def test_import_linter_contract_holds(capsys, monkeypatch):
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)  # the package as checked out, whatever is installed
    monkeypatch.syspath_prepend(str(ROOT))
    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert code == 0, out[-4000:]
    assert "1 kept, 0 broken" in out


def test_every_module_is_in_a_layer():
    # A new subpackage or top-level module cannot escape the contract.
    listed = set(layer_modules())
    top = {f"mlx_lm_batched.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    top |= {f"mlx_lm_batched.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
    assert top == listed, (sorted(top - listed), sorted(listed - top))


def test_no_import_cycles():
    graph = grimp.build_graph("mlx_lm_batched")
    modules = sorted(graph.modules)
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            # A package importing its own submodules (an __init__ re-export) is no cycle.
            if len(component) > 1 and not all(c.startswith(v) or v.startswith(c) for c in component):
                cycles.append(sorted(component))

    sys.setrecursionlimit(10000)
    for m in modules:
        if m not in index:
            visit(m)
    assert not cycles, cycles


@pytest.mark.parametrize("name", SHIMS)
def test_mlx_lm_module_names_are_thin_reexports(name):
    path = PACKAGE / f"{name}.py"
    tree = ast.parse(path.read_text())
    body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body  # docstring
    for node in body:
        entry = (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                 and getattr(node.test.left, "id", None) == "__name__")
        exported = isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["__all__"]
        assert isinstance(node, ast.ImportFrom) or entry or exported, (name, ast.dump(node)[:200])
    module = importlib.import_module("mlx_lm_batched." + name.replace("/", "."))
    assert module.__all__ and all(hasattr(module, n) for n in module.__all__)
    assert "__getattr__" not in vars(module)
