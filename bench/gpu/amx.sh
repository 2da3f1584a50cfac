#!/usr/bin/env bash
# Issue 28's AMX run, for a lent machine whose CPU has AMX (the H200 machine's Xeon reports amx_tile, amx_int8
# and amx_bf16; this project's own VMs have none). No GPU work: it builds without CUDA, then
#   1. tests/cpp/amx_emulated.cpp built twice, on emulated tiles and on the real ones: the "bits" lines (hashes
#      of the outputs' float bits) must be equal, which makes AMX figures computed through the emulation
#      (perplexity, with cmake -DPYINFER_AMX_EMULATE=ON) the hardware's,
#   2. the op and model tests with every kernel table this CPU has (tests/test_amx.py's real-AMX cases among them),
#   3. with KERNELS=1, the kernel benchmark (bench/test_bench_quant_types.py): each weight type at 1, 64 and 256
#      tokens, on the AMX table and the AVX-512 one, 2 threads,
#   4. prefill on a SmolLM2-shaped model (bench/gpu/shaped_model.py: random weights, real shapes and types),
#      PYINFER_ISA=avx512 against amx, alternating: 256 and 2048 tokens on 2 threads (ROUNDS rounds, default 5),
#      2048 and 6144 on 16 threads (3 rounds),
# writing logs, the benchmark JSON and prefill.jsonl to OUTDIR. Carry .whl (gguf, highspy) as for check.sh.
#
#   bash bench/gpu/amx.sh OUTDIR
set -uo pipefail
OUT="${1:?usage: bash bench/gpu/amx.sh OUTDIR}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
exec > >(tee "$OUT/amx.log") 2>&1
step() { echo; echo "== $(date +%T) $*"; }

step "machine"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L2|L3" | tee "$OUT/cpu.txt"
echo "amx flags: $(grep -o -w -E 'amx_[a-z0-9]+' /proc/cpuinfo | sort -u | tr '\n' ' ')" | tee -a "$OUT/cpu.txt"
export CMAKE_ARGS="${CMAKE_ARGS:-} -DPYINFER_CUDA=OFF"
source bench/gpu/setup.sh
"$PY" -P -c "from pyinfer import _core; print('kernel tables:', _core.available_isas())" | tee -a "$OUT/cpu.txt"

step "the AMX kernel on emulated and on real tiles: the same bits"
CPPSRC="csrc/kernels/matmul_scalar.cpp csrc/kernels/quant_blocks.cpp csrc/graph/dtype.cpp csrc/kernels/ops_float.cpp
  csrc/kernels/attention.cpp csrc/kernels/sparse_ffn_scalar.cpp"
g++ -O2 -std=c++17 -mavx2 -mfma -mf16c -Icsrc tests/cpp/amx_emulated.cpp $CPPSRC -o /tmp/amx_emulated
g++ -O2 -std=c++17 -DPYINFER_AMX_REAL -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mamx-tile \
  -mamx-int8 -Icsrc tests/cpp/amx_emulated.cpp $CPPSRC -o /tmp/amx_real
/tmp/amx_emulated > "$OUT/amx_emulated.txt"; /tmp/amx_real > "$OUT/amx_real.txt"
paste "$OUT/amx_emulated.txt" "$OUT/amx_real.txt"
if diff <(grep bits "$OUT/amx_emulated.txt") <(grep bits "$OUT/amx_real.txt") >/dev/null; then
  echo "bits: equal"; else echo "bits: DIFFERENT"; fi

step "op tests on every kernel table"
"$PY" -P -m pytest -q -p no:cacheprovider tests/test_amx.py tests/test_ops.py tests/test_quant_types.py \
  tests/test_moe.py tests/test_model.py -k "not real and not seeded and not stop_strings and not chat_uses" \
  --junitxml="$OUT/tests.xml" 2>&1 | tail -15
TESTS=${PIPESTATUS[0]}

if [ "${KERNELS:-0}" = 1 ]; then
step "kernel benchmark: AMX against AVX-512, 2 threads"
"$PY" -P -m pytest -q -p no:cacheprovider bench/test_bench_quant_types.py -k "not F16 and not avx2" \
  --benchmark-json="$OUT/quant_kernels_amx.json" --benchmark-min-rounds=5 --benchmark-max-time=0.2 \
  --benchmark-columns=median 2>&1 | tail -60
fi

step "prefill on a SmolLM2-shaped model: PYINFER_ISA=avx512 against amx, alternating"
"$PY" bench/gpu/shaped_model.py /tmp/smollm2-shaped.gguf
run() {  # THREADS PROMPT ROUNDS
  for ROUND in $(seq "$3"); do
    for ISA in avx512 amx; do
      R=$(PYINFER_ISA=$ISA "$PY" -P -m pyinfer.cli bench -m /tmp/smollm2-shaped.gguf -t "$1" -p "$2" -g 4 -r 1 \
        --json) || { echo "bench failed: $ISA $1 $2"; continue; }
      echo "{\"isa\": \"$ISA\", \"threads\": $1, \"round\": $ROUND, \"result\": $R}" >> "$OUT/prefill.jsonl"
      echo "$ISA t=$1 p=$2 round $ROUND: $(echo "$R" | "$PY" -c 'import json,sys; print(round(json.load(sys.stdin)["prefill_tok_s"]))') tok/s"
    done
  done
}
ROUNDS="${ROUNDS:-5}"
run 2 256 "$ROUNDS"
run 2 2048 "$ROUNDS"
run 16 2048 3
run 16 6144 3
step "done: tests rc=$TESTS"
exit "$TESTS"
