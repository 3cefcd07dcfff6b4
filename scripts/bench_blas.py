"""``bench.py --compare-blas``: the whole bench once per CPU BLAS found on the machine,
each in its own process (the BLAS is process-wide), and the table of their ratios."""

import json
import os
import subprocess
import sys

from mlx_lm_batched import _blas

BLAS_RUNS = (("MKL", "mkl", _blas.find_mkl), ("OpenBLAS", "openblas", _blas.find_openblas),
             ("bundled BLAS", "none", lambda: True))


def compare_blas(script, argv):
    """Run the bench (``script`` with ``argv``) under each BLAS found here, each in its
    own process; print the ratios and return each run's result by BLAS label."""
    results = {}
    base = [a for a in argv if a != "--compare-blas"]
    env = {k: v for k, v in os.environ.items()
           if k not in (_blas.ENV, _blas.DISABLE_ENV)}  # MLX_LM_BATCHED_OPENBLAS may pick one
    for label, choice, find in BLAS_RUNS:
        if not find():
            print(f"note: {label} not found on this machine; skipped", file=sys.stderr)
            continue
        out = f"/tmp/bench-{os.getpid()}-{choice}.json"
        cmd = [sys.executable, script, *strip_outputs(base), "--json", out]
        subprocess.run(cmd, env=dict(env, **{_blas.ENV: choice}), check=True)
        with open(out) as f:
            results[label] = json.load(f)
        os.unlink(out)
    print(f"\nBLAS comparison (tokens/s of each BLAS over the bundled BLAS's, same configuration;"
          f" {results['bundled BLAS']['machine']}):")
    fast = [label for label in results if label != "bundled BLAS"]
    print(f"{'config':8s} {'bs':>3s} " + " ".join(f"{label + ' ' + what:>16s}" for label in fast
                                                   for what in ("prompt x", "gen x")))
    slow = results["bundled BLAS"]["rows"]
    for i, y in enumerate(slow):
        cells = []
        for label in fast:
            x = results[label]["rows"][i]
            cells += [f"{x['prompt_tps'] / y['prompt_tps']:16.2f}",
                      f"{x['gen_tps'] / y['gen_tps']:16.2f}"]
        print(f"{y['config']:8s} {y['batch_size']:3d} " + " ".join(cells))
    return results


def strip_outputs(argv):
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--json", "--plot"):
            skip = True
        else:
            out.append(a)
    return out
