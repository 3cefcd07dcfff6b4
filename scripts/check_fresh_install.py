"""Prove the README on a clean environment: a new venv, README command 1, the Python example.

CI runs this before the test suite (``.ci/run``). It creates a virtual environment that
sees none of this machine's packages, runs the README's first ``bash`` block exactly as
written inside it (so it installs exactly what a new user installs: no extras, no torch),
checks that ``import torch`` fails there, then runs every ``python`` block of the README
in the same venv and checks what each prints. A README or dependency change that breaks
either makes this exit non-zero.

    python scripts/check_fresh_install.py [--venv DIR] [--keep]
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


def run(cmd, env, timeout, **kw):
    """Run ``cmd`` (a bash line or an argv list); return (returncode, stdout, stderr, seconds)."""
    tic = time.perf_counter()
    shell = isinstance(cmd, str)
    proc = subprocess.run(["bash", "-c", cmd] if shell else cmd, cwd=ROOT, env=env,
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


def check_python_examples(env):
    # The README's Python example: its first python block (the others need more setup
    # and run in tests/test_readme.py and tests/test_server_openai.py).
    blocks = readme_blocks("python")[:1]
    expect(blocks, "README has no Python example")
    for code in blocks:
        rc, out, err, secs = run(["python", "-c", code], env, timeout=1200)
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
        env = venv_env(venv, home)
        summary = check_command_1(env)
        check_no_torch(env)
        check_fast_blas(env, summary)
        check_python_examples(env)
    except (Failed, subprocess.TimeoutExpired) as e:
        print(f"fresh-install check FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            if args.venv:
                shutil.rmtree(venv, ignore_errors=True)
    print("fresh-install check passed: README command 1 and the Python example run in a new venv without torch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
