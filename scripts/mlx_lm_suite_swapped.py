"""Run mlx-lm's own test files against this package (docs/drop-in.md counts them).

    python scripts/mlx_lm_suite_swapped.py TESTS_DIR [OUT_DIR]

``TESTS_DIR`` is the ``tests/`` of mlx-lm's sdist (``pip download --no-deps --no-binary
:all: mlx-lm==0.32.2``, unpacked). Each ``test_*.py`` runs twice, offline, one pytest at a
time: with mlx-lm itself, and with a ``conftest.py`` whose ``sys.meta_path`` finder serves
every ``mlx_lm`` / ``mlx_lm.*`` import from ``mlx_lm_batched``. Prints, per file, the tests
mlx-lm passes and how many of them pass here, then the totals; the pytest logs are left in
``OUT_DIR`` (default: a temporary directory). The swapped run imports the package from this
checkout; ``test_chat``'s two ``main`` tests are left out of it (they patch
``mlx_lm.chat.load``, which the CLI here does not look up, so ``main`` would load the real
default model and wait for input).
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFTEST = '''import importlib, importlib.abc, importlib.util, sys


class _Swap(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """mlx_lm[.x] -> mlx_lm_batched[.x], registered under the mlx_lm name."""

    def find_spec(self, name, path=None, target=None):
        if name == "mlx_lm" or name.startswith("mlx_lm."):
            return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return importlib.import_module("mlx_lm_batched" + spec.name[len("mlx_lm"):])

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Swap())
'''
SKIP = {"test_chat": ["-k", "arg_parser"]}


def passed(tests_dir, test_file, swapped, log):
    """The node ids of ``test_file`` that pass (mlx-lm's, or this package's when swapped)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=str(REPO) if swapped else "")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(test_file)]
    cmd += SKIP.get(test_file.stem, []) if swapped else ["--noconftest"]
    with open(log, "w") as out:
        subprocess.run(cmd, cwd=tests_dir.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
                       timeout=1200)
    return set(re.findall(r"^PASSED (\S+)", Path(log).read_text(), re.M))


def main(argv):
    if len(argv) not in (1, 2):
        sys.exit(__doc__.strip().splitlines()[2].strip())
    work = Path(tempfile.mkdtemp(prefix="mlx_lm_suite_"))
    out = Path(argv[1]) if len(argv) == 2 else work
    out.mkdir(parents=True, exist_ok=True)
    tests = work / "tests"
    shutil.copytree(argv[0], tests, ignore=shutil.ignore_patterns("conftest.py", "__pycache__"))
    totals = [0, 0]
    for test_file in sorted(tests.glob("test_*.py")):
        theirs = passed(tests, test_file, False, out / f"mlx_lm.{test_file.stem}.log")
        (tests / "conftest.py").write_text(CONFTEST)
        ours = passed(tests, test_file, True, out / f"swapped.{test_file.stem}.log") & theirs
        (tests / "conftest.py").unlink()
        totals[0] += len(theirs)
        totals[1] += len(ours)
        print(f"{test_file.stem}: {len(ours)} of {len(theirs)}", flush=True)
    print(f"total: {totals[1]} of the {totals[0]} tests mlx-lm passes (logs in {out})")


if __name__ == "__main__":
    main(sys.argv[1:])
