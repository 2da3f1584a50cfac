#!/usr/bin/env bash
# The GPU check of issue 12, one script for a GPU machine with nothing but its own image (CUDA, CMake,
# PyTorch's Python; no network): builds the extension with CUDA, runs the CUDA op tests against the CPU and
# the hybrid tests, then the hybrid decode benchmark on a SmolLM2-shaped model against the torch peer, writing
# a log, JSON, markdown and a timeline plot to OUTDIR. Missing wheels (gguf, highspy, accelerate's) travel in
# .whl/ (see bench/gpu/README.md). Without a GPU it runs its CPU half: the same tests on a stand-in device and
# the benchmark with --device standin.
#
#   bash bench/gpu/check.sh OUTDIR
set -uo pipefail
OUT="${1:?usage: bash bench/gpu/check.sh OUTDIR}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
exec > >(tee "$OUT/check.log") 2>&1
step() { echo; echo "== $(date +%T) $*"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
nvcc --version 2>/dev/null | tail -1 || echo "no nvcc"
source bench/gpu/setup.sh

DEVICE=cuda
if [ "$GPU" = 1 ]; then
  "$PY" -P -c "from pyinfer import _core; print('split sync (2304 bytes up and back): %.1f us' % (1e6 * _core.cuda_sync_seconds(2304)))"
else
  DEVICE=standin
  export PYINFER_TEST_DEVICE=standin
fi

step "op tests against the CPU ($DEVICE), hybrid and placement tests"
"$PY" -P -m pytest -q -p no:cacheprovider tests/test_cuda_ops.py tests/test_hybrid.py tests/test_placement.py \
  --junitxml="$OUT/tests.xml"
TESTS=$?

"$PY" bench/gpu/shaped_model.py /tmp/smollm2-shaped.gguf
if [ "$GPU" = 1 ]; then
  step "prefill of 512 tokens on the GPU alone: cuBLAS (fp16) against the backend's own matmul kernel"
  for MIN in 32 0; do
    PYINFER_CUBLAS_MIN_TOKENS=$MIN "$PY" -P -m pyinfer.cli bench -m /tmp/smollm2-shaped.gguf --device cuda \
      --vram-budget 4G -p 512 -g 16 -r 3 --json | tee -a "$OUT/prefill_cublas.jsonl"
  done
fi

step "hybrid decode benchmark ($DEVICE) on a SmolLM2-shaped model, against the torch peer"
if [ "$GPU" = 1 ]; then
  ARGS="--threads 8 --rounds 3 --tokens 64 --variants --peer layers accelerate"
else
  ARGS="--threads 1 --rounds 1 --tokens 16 --peer layers"  # the stand-in takes the second core
fi
timeout 300 "$PY" bench/hybrid.py -m /tmp/smollm2-shaped.gguf --device "$DEVICE" $ARGS --out "$OUT" \
  --tag "hybrid_$DEVICE"
BENCH=$?

step "done: tests rc=$TESTS, bench rc=$BENCH"
exit $(( TESTS != 0 || BENCH != 0 ))
