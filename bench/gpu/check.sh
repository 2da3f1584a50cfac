#!/usr/bin/env bash
# The GPU check of issue 12, one script for a GPU machine with nothing but its own image (CUDA, CMake,
# PyTorch's Python; no network): builds the extension with CUDA, runs the CUDA op tests against the CPU and
# the hybrid tests, then the hybrid decode benchmark on a SmolLM2-shaped model, writing a log and JSON to
# OUTDIR. Missing wheels (gguf, highspy) travel in .whl/ (see bench/gpu/README.md). Without a GPU it runs its
# CPU half: the same tests on a stand-in device and the benchmark with --device standin.
#
#   bash bench/gpu/check.sh OUTDIR
set -uo pipefail
OUT="${1:?usage: bash bench/gpu/check.sh OUTDIR}"
mkdir -p "$OUT"
LOG="$OUT/check.log"
cd "$(dirname "$0")/../.."
exec > >(tee "$LOG") 2>&1
PY="${PYTHON:-python3}"  # run with -P where it imports pyinfer: the built one, not ./pyinfer (no _core)
export PYTHONUNBUFFERED=1
step() { echo; echo "== $(date +%T) $*"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
nvcc --version 2>/dev/null | tail -1 || echo "no nvcc"
GPU=0
if nvidia-smi -L >/dev/null 2>&1; then GPU=1; fi

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  step "wheels carried along"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

step "build (CUDA when nvcc is there; sm_90 only on a GPU machine, to build fast)"
ARCH=""
[ "$GPU" = 1 ] && ARCH="-DCMAKE_CUDA_ARCHITECTURES=90"
export CMAKE_ARGS="${CMAKE_ARGS:-} $ARCH"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
"$PY" -m pip install -q --no-build-isolation --no-deps --no-index --upgrade --target /tmp/pyinfer-site . || { echo "BUILD FAILED"; exit 1; }
export PYTHONPATH=/tmp/pyinfer-site${PYTHONPATH:+:$PYTHONPATH}
"$PY" -P -c "from pyinfer import _core; print('cuda built:', _core.cuda_built(), 'devices:', _core.cuda_devices())"

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

step "hybrid decode benchmark ($DEVICE) on a SmolLM2-shaped model"
"$PY" bench/gpu/shaped_model.py /tmp/smollm2-shaped.gguf
ROUNDS=3; TOKENS=64
[ "$GPU" = 1 ] || { ROUNDS=1; TOKENS=16; }
timeout 300 "$PY" bench/hybrid.py -m /tmp/smollm2-shaped.gguf --device "$DEVICE" --threads "$( [ "$GPU" = 1 ] && echo 8 || echo 2 )" \
  --rounds "$ROUNDS" --tokens "$TOKENS" --out "$OUT" --tag "hybrid_$DEVICE"
BENCH=$?

step "done: tests rc=$TESTS, bench rc=$BENCH"
exit $(( TESTS != 0 || BENCH != 0 ))
