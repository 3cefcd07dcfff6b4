"""Reporting for ``bench.py``: machine description, the stdout table and the plot."""

import os
import subprocess
import sys

import mlx.core as mx


def machine():
    name = "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                name = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, mlx {mx.__version__}, device {mx.default_device()}"


def attention():
    """Whether our CPU primitives (decode attention, RMSNorm, RoPE) serve, for the
    benchmarks' headers (builds them first, so a run reports what it measured)."""
    from mlx_lm_batched import _cpu_prims

    _cpu_prims.module()
    return _cpu_prims.describe()


def kernels():
    """The BLAS and our native kernels as the benchmarks' headers name them."""
    from mlx_lm_batched import _blas

    return f"{_blas.describe()}; {attention()}"


def print_table(result, file=sys.stdout):
    blas = result["blas"] + (f"; {result['attention']}" if result.get("attention") else "")
    print(f"model {result['model']}  ({result['machine']}; BLAS: {blas}; "
          f"dequantize: {result['dequantize']})", file=file)
    print(f"{result['prompts']} prompts ({min(result['prompt_lengths'])}-"
          f"{max(result['prompt_lengths'])} tokens, {sum(result['prompt_lengths'])} total), "
          f"{result['max_tokens']} new tokens each; best of {result['repeats']} interleaved runs; "
          f"weights {result['weights_gb']:.2f} GB, ideal KV {result['ideal_kv_gb']:.2f} GB"
          + (" (with recurrent state)" if result.get("hybrid") else ""), file=file)
    if "load_avg_start" in result:
        print("load average (1/5/15 min) at start {}, at end {}".format(
            *("/".join(f"{x:.1f}" for x in result[k]) for k in ("load_avg_start", "load_avg_end"))),
            file=file)
    head = (f"{'config':8s} {'bs':>3s} {'prompt t/s':>10s} {'gen t/s':>8s} {'e2e t/s':>8s} "
            f"{'TTFT 1st':>8s} {'TTFT avg':>8s} {'peak GB':>7s} {'mem x':>5s} {'pad %':>6s} "
            f"{'gen/seq':>7s} {'gen/mlx':>7s} {'e2e/mlx':>7s} {'=seq':>5s}")
    print(head, file=file)
    for m in result["rows"]:
        mlx_gen = f"{m['gen_vs_mlx_lm']:7.2f}" if "gen_vs_mlx_lm" in m else f"{'':7s}"
        mlx_e2e = f"{m['e2e_vs_mlx_lm']:7.2f}" if "e2e_vs_mlx_lm" in m else f"{'':7s}"
        print(f"{m['config']:8s} {m['batch_size']:3d} {m['prompt_tps']:10.1f} {m['gen_tps']:8.1f} "
              f"{m['e2e_tps']:8.1f} {m['ttft_first_s']:8.2f} {m['ttft_mean_s']:8.2f} "
              f"{m['peak_gb']:7.2f} {m['peak_vs_weights_plus_ideal_kv']:5.2f} "
              f"{100 * m['padding_share']:6.1f} {m['gen_vs_seq']:7.2f} "
              f"{mlx_gen} {mlx_e2e} {100 * m['same_tokens_as_seq']:4.0f}%", file=file)
    own = [m for m in result["rows"] if "same_tokens_as_own_bs1" in m and m["batch_size"] > 1]
    if own:
        print("rows equal to the same side's batch-1 rows: " + ", ".join(
            f"{m['config']}@{m['batch_size']} {100 * m['same_tokens_as_own_bs1']:.0f}%"
            for m in own), file=file)


def plot(results, out):
    """Throughput against batch size: generation tokens/s (decode only) and
    end-to-end tokens/s (prefill included), one line per side and BLAS setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=80)
    metrics = (("gen_tps", "generation tokens/s (decode)"),
               ("e2e_tps", "end-to-end tokens/s (with prefill)"))
    for ax, (key, title) in zip(axes, metrics):
        for label, result in results.items():
            rows = result["rows"]
            seq = next(m for m in rows if m["config"] == "seq")
            for name, style in (("ours", "-o"), ("ours+dq", "-^"), ("mlx-lm", "--s")):
                pts = [(m["batch_size"], m[key]) for m in rows if m["config"] == name]
                if pts:
                    ax.plot(*zip(*pts), style, label=f"{name} {label}".strip())
            ax.axhline(seq[key], color="gray", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("completion batch size")
        ax.set_title(f"{title}; dotted: sequential", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
