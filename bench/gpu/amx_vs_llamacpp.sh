#!/usr/bin/env bash
# Issue 28's AMX prefill against llama.cpp, on the H200 machine's Xeon (the only AMX CPU this project reaches):
# the real SmolLM2-135M Q4_1 file, prefill of 256 and 2048 tokens on 2 threads (and 2048 on 15), pyinfer (its
# amx table, and PYINFER_ISA=avx512) against llama.cpp's llama-bench built with its own AMX kernels, alternating
# rounds, one JSON line per run in OUTDIR/prefill.jsonl (bench/amx_table.py does not read llama.cpp's rows;
# the closing note quotes them).
#
# Prepared here, since nothing reaches a hub or a registry there:
#   llama-bench, static, from the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp, with AMX on:
#     cmake -S vendor/llama.cpp -B /tmp/lb -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
#       -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON -DBUILD_SHARED_LIBS=OFF \
#       -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
#     cmake --build /tmp/lb --target llama-bench -j 2 && mkdir -p .llama && cp /tmp/lb/bin/llama-bench .llama/
#   the model in two parts, as for relufy.sh: split -b 48M <SmolLM2 Q4_1 gguf> .model/part-
# (.llama/ and .model/ ignored through .git/info/exclude.) Two back-to-back calls (the machine stays warm 30 s):
#   1. carry [".model/part-aa"]: bash bench/gpu/amx_vs_llamacpp.sh --stage
#   2. carry [".model/part-ab", ".llama", ".whl"]: bash bench/gpu/amx_vs_llamacpp.sh $OUT
#
#   bash bench/gpu/amx_vs_llamacpp.sh OUTDIR [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/model_parts.sh "$@"
OUT="${1:?usage: bash bench/gpu/amx_vs_llamacpp.sh OUTDIR [ROUNDS]}"
ROUNDS="${2:-3}"
mkdir -p "$OUT"
exec > >(tee "$OUT/amx_vs_llamacpp.log") 2>&1
export CMAKE_ARGS="${CMAKE_ARGS:-} -DPYINFER_CUDA=OFF"
source bench/gpu/setup.sh
join_model
"$PY" -P -c 'from pyinfer import _core; print("kernel tables:", _core.available_isas())'
LB=.llama/llama-bench
"$LB" --help >/dev/null 2>&1 || { echo "no runnable $LB"; exit 1; }
for THREADS_P in "2 256" "2 2048" "15 2048"; do
  set -- $THREADS_P
  for ROUND in $(seq "$ROUNDS"); do
    for ENGINE in llama.cpp pyinfer-amx pyinfer-avx512; do
      case $ENGINE in
        llama.cpp) R=$("$LB" -m "$MODEL" -t "$1" -p "$2" -n 0 -r 1 -o jsonl 2>/dev/null | tail -1) ;;
        pyinfer-amx) R=$(PYINFER_ISA=amx "$PY" -P -m pyinfer.cli bench -m "$MODEL" -t "$1" -p "$2" -g 1 -r 1 --json) ;;
        pyinfer-avx512) R=$(PYINFER_ISA=avx512 "$PY" -P -m pyinfer.cli bench -m "$MODEL" -t "$1" -p "$2" -g 1 -r 1 --json) ;;
      esac
      [ -n "$R" ] || { echo "failed: $ENGINE t=$1 p=$2"; continue; }
      echo "{\"engine\": \"$ENGINE\", \"threads\": $1, \"prompt\": $2, \"round\": $ROUND, \"result\": $R}" \
        | tee -a "$OUT/prefill.jsonl" | cut -c1-160
    done
  done
done
