"""Prove the README and the release on a clean environment: the built wheel, a new venv,
README command 1, a console script, the Python example.

CI runs this before the test suite (``.ci/run``). It builds the sdist and the wheel
(``python -m build``: the wheel is built from the sdist, so a file missing from the sdist
fails here), creates a virtual environment that sees none of this machine's packages, runs
the README's first ``bash`` block exactly as written inside it (so it installs exactly what
a new user installs: no extras, no torch), checks that ``import torch`` fails there, then
installs the built wheel over it, checks its version and console scripts, runs the
``mlx_lm_batched.generate`` console script, and runs the README's Python example on the
wheel's package. A README, packaging or dependency change that breaks any of it makes this
exit non-zero.

    python scripts/check_fresh_install.py [--venv DIR] [--keep]

Needs ``build`` (``pip install build``) in the Python that runs it.
"""

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_blocks(kind):
    """The README's fenced code blocks of one language, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(rf"```{kind}\n(.*?)```", text, re.S)


def run(cmd, env, timeout, cwd=ROOT, **kw):
    """Run ``cmd`` (a bash line or an argv list) in ``cwd`` (the checkout unless given: the
    README's commands run there); return (returncode, stdout, stderr, seconds)."""
    tic = time.perf_counter()
    shell = isinstance(cmd, str)
    proc = subprocess.run(["bash", "-c", cmd] if shell else cmd, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - tic


class Failed(Exception):
    pass


def expect(condition, what, out=""):
    if not condition:
        raise Failed(f"{what}\n--- output (tail) ---\n{out[-4000:]}")


def venv_env(venv, home):
    """The environment a user has after ``source venv/bin/activate`` in a new shell."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "MLX_LM_BATCHED", "VIRTUAL_ENV", "CONDA"))}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # A new user has no tokenizer/model caches; pip's download cache is kept (speed only).
    env.setdefault("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    env["HOME"] = str(home)
    env["HF_HUB_OFFLINE"] = "1"  # nothing may come from a model hub
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def check_command_1(env):
    command = readme_blocks("bash")[0].strip()
    expect(command.startswith("pip install") and "mlx_lm_batched.generate" in command,
           f"README's first bash block is not the install-and-generate command:\n{command}")
    print(f"$ {command}", flush=True)
    rc, out, err, secs = run(command, env, timeout=1800)
    both = out + err
    expect(rc == 0, f"README command 1 exited {rc}", both)
    expect("Traceback" not in both, "README command 1 printed a traceback", both)
    sections = re.findall(r"^==== (.+?) ====$", out, re.M)
    expect(len(sections) == 2, f"expected two answers, got sections {sections}", both)
    answers = re.split(r"^==== .+? ====$", out, flags=re.M)[1:]
    expect(all(a.strip() for a in answers), "an answer is empty", both)
    expect("Paris" in answers[0], "the capital of France is not Paris in the first answer", both)
    summary = [line for line in err.splitlines() if line.startswith("[summary]")]
    expect(summary, "no [summary] line on stderr", both)
    print(out.rstrip())
    print(summary[-1])
    print(f"README command 1: {secs:.0f} s (install and generation)", flush=True)
    return summary[-1]


def check_no_torch(env):
    rc, out, err, _ = run(["python", "-c", "import torch"], env, timeout=120)
    expect(rc != 0 and "No module named 'torch'" in err,
           "torch is importable in the fresh venv: the default install pulls it in", out + err)


def check_fast_blas(env, summary):
    if not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")):
        return
    code = "import mlx_lm_batched._blas as b; print(getattr(b, 'describe', lambda: 'unknown')())"
    rc, out, err, _ = run(["python", "-c", code], env, timeout=120)
    expect(rc == 0, "cannot import mlx_lm_batched._blas in the fresh venv", out + err)
    name = out.strip()
    print(f"BLAS in the fresh venv: {name}")
    expect(not name.startswith(("bundled", "none", "unknown")),
           f"no fast BLAS in a fresh venv on Linux x86-64 (got {name!r})", out + err)


def build_dists(out):
    """Build the sdist and the wheel into ``out``; return the wheel's path."""
    print(f"$ python -m build --outdir {out}", flush=True)
    rc, stdout, stderr, secs = run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                                   dict(os.environ), timeout=1800)
    expect(rc == 0, f"python -m build exited {rc}", stdout + stderr)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    expect(len(wheels) == 1 and len(sdists) == 1, f"expected one wheel and one sdist, got {wheels + sdists}")
    version = package_version()
    expect(f"-{version}-" in wheels[0].name and sdists[0].name.endswith(f"-{version}.tar.gz"),
           f"the built files do not carry version {version}: {wheels[0].name}, {sdists[0].name}")
    print(f"built {wheels[0].name} and {sdists[0].name} in {secs:.0f} s", flush=True)
    return wheels[0]


def package_version():
    """The version written in mlx_lm_batched/_version.py (the one place it is written)."""
    text = (ROOT / "mlx_lm_batched" / "_version.py").read_text(encoding="utf-8")
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def console_scripts():
    """The names of pyproject.toml's [project.scripts]."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[)", text, re.M | re.S).group(1)
    return re.findall(r'^"?([\w.-]+)"?\s*=', section, re.M)


def check_wheel(env, venv, wheel, outside):
    """Install the built wheel in the venv (over README command 1's install), then check,
    from ``outside`` the checkout (whose package ``python -c`` would import first), that the
    package imported is the wheel's, and run one console script."""
    rc, out, err, _ = run(["python", "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)],
                          env, timeout=600)
    expect(rc == 0, f"pip install of {wheel.name} exited {rc}", out + err)
    code = ("import importlib.metadata as m, mlx_lm_batched as p; "
            "print(p.__version__, m.version('mlx-lm-batched'), p.__file__)")
    rc, out, err, _ = run(["python", "-c", code], env, timeout=120, cwd=outside)
    expect(rc == 0, "cannot import the installed wheel", out + err)
    version, dist_version, where = out.split()
    expect(version == dist_version == package_version(),
           f"__version__ {version}, metadata {dist_version}, _version.py {package_version()}", out)
    expect(where.startswith(str(venv)), f"mlx_lm_batched imported from {where}, not the venv", out)
    missing = [name for name in console_scripts() if not (venv / "bin" / name).exists()]
    expect(not missing, f"console scripts missing from {venv / 'bin'}: {missing}")
    command = [str(venv / "bin" / "mlx_lm_batched.generate"), "--prompt", "What is the capital of France?",
               "--max-tokens", "16"]
    print("$ " + " ".join(command[:1]) + " --prompt 'What is the capital of France?' --max-tokens 16", flush=True)
    rc, out, err, secs = run(command, env, timeout=600, cwd=outside)
    both = out + err
    expect(rc == 0 and "Traceback" not in both, f"the console script exited {rc}", both)
    expect("==== --prompt #1 ====" in out and "Paris" in out, "the console script's answer is missing", both)
    print(out.rstrip())
    print(f"wheel {wheel.name} installed: version {version}, {len(console_scripts())} console scripts, "
          f"mlx_lm_batched.generate ran in {secs:.0f} s", flush=True)


def check_python_examples(env, cwd):
    # The README's Python example: its first python block (the others need more setup
    # and run in tests/test_readme.py and tests/test_server_openai.py).
    blocks = readme_blocks("python")[:1]
    expect(blocks, "README has no Python example")
    for code in blocks:
        rc, out, err, secs = run(["python", "-c", code], env, timeout=1200, cwd=cwd)
        both = out + err
        expect(rc == 0, f"README Python example exited {rc}", both)
        expect("Traceback" not in both, "README Python example printed a traceback", both)
        expect(sum("->" in line for line in out.splitlines()) == 3, "expected three answers", both)
        expect("Paris" in out and "Bonjour" in out, "the real model's answers are missing", both)
        print(out.rstrip())
        print(f"README Python example: {secs:.0f} s", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", default=None, help="where to create the venv (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the venv afterwards")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fresh-install-"))
    venv = Path(args.venv) if args.venv else work / "venv"
    home = work / "home"
    home.mkdir()
    try:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        wheel = build_dists(work / "dist")
        env = venv_env(venv, home)
        summary = check_command_1(env)
        check_no_torch(env)
        check_fast_blas(env, summary)
        check_wheel(env, venv, wheel, outside=home)
        check_python_examples(env, cwd=home)  # on the wheel's package
    except (Failed, subprocess.TimeoutExpired) as e:
        print(f"fresh-install check FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            if args.venv:
                shutil.rmtree(venv, ignore_errors=True)
    print("fresh-install check passed: the wheel and sdist build; README command 1, the built wheel's "
          "console script and the Python example run in a new venv without torch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
