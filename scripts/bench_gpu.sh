#!/usr/bin/env bash
# Ours against mlx-lm on a Linux machine with an NVIDIA GPU, in one table.
#
#   scripts/bench_gpu.sh --model DIR [--venv DIR] [--out DIR] [--dry-run]
#
# In a fresh virtual environment it installs MLX's CUDA build (MLX_SPEC, default
# "mlx[cuda]"), mlx-lm (MLX_LM_SPEC, default "mlx-lm==0.32.2") and this package, then runs
#   1. scripts/bench.py: batch_generate against mlx-lm's batch generator, batch 1/4/16;
#   2. scripts/bench_server.py: our server against mlx_lm.server, 1/4/16 concurrent
#      streams, every prompt 256 tokens and every output 64 (EOS banned on both);
# and prints one table from both (scripts/bench_gpu_table.py; JSON kept in --out).
# Under 10 minutes, pip included: the steps' time limits add up to 9.5 minutes
# (240 s pip, 60 s this package, 120 s bench.py, 150 s the servers).
#
# The weights come from the local directory DIR: nothing is downloaded from the
# Hugging Face hub on the GPU machine (HF_HUB_OFFLINE=1). Make DIR on any machine
# where this package is installed and copy it over, e.g. SmolLM2-135M in float32:
#
#   python -m mlx_lm_batched.convert --hf-path HuggingFaceTB/SmolLM2-135M-Instruct \
#       --mlx-path smollm2-f32 --dtype float32
#
# --dry-run prints the commands without running them (no venv, no GPU needed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL=""
VENV="${TMPDIR:-/tmp}/mlx-lm-batched-gpu-venv"
OUT="bench-gpu"
DRY_RUN=0
MLX_SPEC=${MLX_SPEC:-"mlx[cuda]"}
MLX_LM_SPEC=${MLX_LM_SPEC:-"mlx-lm==0.32.2"}

die() { echo "bench_gpu.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL=${2:-}; shift 2 ;;
        --venv) VENV=${2:-}; shift 2 ;;
        --out) OUT=${2:-}; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ -n $MODEL ]] || die "--model DIR is required: a local model directory (see --help)"
[[ -f $MODEL/config.json ]] || die "--model '$MODEL': not a model directory (no config.json)"
MODEL=$(cd "$MODEL" && pwd)

# Print each command; run it unless --dry-run.
step() {
    printf '+'; printf ' %q' "$@"; printf '\n'
    if [[ $DRY_RUN == 0 ]]; then "$@"; fi
}

# This package's dependencies but its CPU-only ones (mlx[cpu], MKL): installed beside
# mlx[cuda], mlx[cpu] would bring a second MLX backend.
mapfile -t DEPS < <(python3 - "$ROOT/pyproject.toml" <<'PYEOF'
import re, sys
block = re.search(r"^dependencies = \[(.*?)^\]", open(sys.argv[1]).read(), re.S | re.M).group(1)
for line in block.splitlines():
    m = re.match(r'\s*"([^"]+)"', line)
    if m and not re.match(r"(mlx|mkl)\b", m.group(1)):
        print(m.group(1))
PYEOF
)
[[ ${#DEPS[@]} -gt 0 ]] || die "no dependencies found in $ROOT/pyproject.toml"

PY="$VENV/bin/python"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
step mkdir -p "$OUT"
step python3 -m venv "$VENV"
step timeout 240 "$PY" -m pip install --quiet "$MLX_SPEC" "$MLX_LM_SPEC" "${DEPS[@]}"
step timeout 60 "$PY" -m pip install --quiet --no-deps "$ROOT"
step "$PY" -c "import mlx.core as mx; print('MLX device:', mx.default_device()); assert mx.default_device() == mx.gpu"
step timeout 120 "$PY" "$ROOT/scripts/bench.py" --model "$MODEL" --batch-sizes 1,4,16 \
    --prompts 16 --max-tokens 64 --repeats 1 --json "$OUT/bench.json"
step timeout 150 "$PY" "$ROOT/scripts/bench_server.py" --model "$MODEL" --fixed-len 256 64 \
    --concurrency 1 4 16 --requests-per-stream 2 --batch-size 16 --json "$OUT/server.json"
step "$PY" "$ROOT/scripts/bench_gpu_table.py" --bench "$OUT/bench.json" --server "$OUT/server.json"
