"""The package's layering: subpackages named after their layer, imports flowing one way
(import-linter's contract in pyproject.toml, imports inside functions included), no
import cycle, and mlx-lm's module paths generated from one table
(``compat/module_table.py``), the command modules as thin files."""

import ast
import importlib
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

from mlx_lm_batched.compat import finder, module_table
from mlx_lm_batched.models import MODEL_TYPES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mlx_lm_batched"
CONTRACT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
# Registered model_types served by another family's file get a module of their own name
# (mlx-lm's ``models.<type>`` names, hyphenated ones included, e.g. ``lfm2-vl``), served
# from the table like mlx-lm's other module paths.
ALIAS_MODULES = sorted(f"models.{t}" for t, m in MODEL_TYPES.items() if t != m)
TABLE_MODULES = sorted(set(module_table.MODULES) - set(module_table.COMMAND_MODULES))


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


@pytest.mark.parametrize("name", module_table.COMMAND_MODULES)
def test_mlx_lm_command_modules_are_thin_files(name):
    # Only the entry (``python -m``), imports and ``__all__`` filled from the table.
    path = PACKAGE / f"{name}.py"
    tree = ast.parse(path.read_text())
    body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body  # docstring
    for node in body:
        entry = (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                 and getattr(node.test.left, "id", None) == "__name__")
        exported = isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["__all__"]
        assert isinstance(node, ast.ImportFrom) or entry or exported, (name, ast.dump(node)[:200])
    assert len(body) <= 3, name
    module = importlib.import_module("mlx_lm_batched." + name)
    assert module.__all__ and all(hasattr(module, n) for n in module.__all__)
    assert "__getattr__" not in vars(module)


@pytest.mark.parametrize("name", TABLE_MODULES + ALIAS_MODULES)
def test_mlx_lm_module_paths_come_from_the_table(name):
    # No file of its own: the import hook fills it from its row, and nothing else.
    assert not (PACKAGE / f"{name.replace('.', '/')}.py").exists(), name
    module = importlib.import_module("mlx_lm_batched." + name)
    assert module.__spec__.origin == finder.ORIGIN
    rows = module_table.sources(name)
    listed = sorted(entry.partition("=")[0] for names in rows.values() for entry in names)
    assert module.__all__ == listed and all(hasattr(module, n) for n in module.__all__)
    # The table may list one of mlx-lm's private helpers (``utils._parse_size``): the
    # module's public names are exactly the table's public ones.
    public = {n for n in vars(module) if not n.startswith("_")}
    listed_public = {n for n in listed if not n.startswith("_")}
    assert public == listed_public, sorted(public ^ listed_public)


@pytest.mark.parametrize("name", sorted(module_table.REFUSED))
def test_refused_mlx_lm_modules_say_what_to_use_in_one_line(name):
    sys.modules.pop(f"mlx_lm_batched.{name}", None)
    with pytest.raises(ImportError) as caught:
        importlib.import_module(f"mlx_lm_batched.{name}")
    assert str(caught.value) == module_table.REFUSED[name]
    assert "mlx_lm_batched" in str(caught.value) and "\n" not in str(caught.value)


def test_refused_modules_under_python_m_print_the_line_alone(tmp_path):
    import subprocess

    for argv in (["-m", "mlx_lm_batched.lora"], ["-m", "mlx_lm_batched.quant.awq"]):
        proc = subprocess.run([sys.executable, *argv, "--help"], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)
        name = argv[1].split(".")[1]
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr[-2000:]
        assert proc.stderr == module_table.REFUSED[name] + "\n", proc.stderr[-2000:]


def test_the_table_answers_only_for_its_paths():
    for missing in ("mlx_lm_batched.no_such_module", "mlx_lm_batched.models.no_such_arch",
                    "mlx_lm_batched.models.llama.x", "mlx_lm.utils", "mlx_lm_batched.models"):
        assert finder.MlxLmPathFinder().find_spec(missing) is None, missing
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mlx_lm_batched.no_such_module")
