#!/usr/bin/env bash
# Issue 26's GPU run: the Mixture-of-Experts CUDA kernels (cuda/kernels/moe.cu), first their tests against the
# CPU (tests/test_cuda_ops.py -k moe: route, expert matmul with and without CATS cuts, combine, route split, a
# tiny qwen3moe and qwen2moe whole and split), then decode and prefill of a Qwen3-30B-A3B-shaped synthetic MoE
# (bench/moe_synthetic.py's model and routing process, LAYERS of its 48 layers, Q4_0, random weights: speeds
# only, never quality) written on the machine: on the CPU alone, every expert on the GPU, and about half of
# them there (the route split, both sides at once). Writes a log and one JSON line per run to OUTDIR.
#
#   bash bench/gpu/moe.sh OUTDIR            # LAYERS=16 (about 6 GB; 48 is the full 17 GB model)
# Run it after check.sh on the same warm machine (setup.sh reuses the build) or alone (it builds). Without a GPU
# it runs the tests on the stand-in device and a 2-layer model (its CPU half).
set -uo pipefail
OUT="${1:?usage: bash bench/gpu/moe.sh OUTDIR}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
exec > >(tee "$OUT/moe.log") 2>&1
source bench/gpu/setup.sh
step() { echo; echo "== $(date +%T) $*"; }

DEVICE=cuda THREADS=15 LAYERS="${LAYERS:-16}"
if [ "$GPU" != 1 ]; then
  DEVICE=standin THREADS=1 LAYERS=2
  export PYINFER_TEST_DEVICE=standin
fi

step "MoE ops and tiny MoE models against the CPU ($DEVICE)"
"$PY" -P -m pytest -q -p no:cacheprovider tests/test_cuda_ops.py -k moe --junitxml="$OUT/moe_tests.xml"
TESTS=$?

MODEL=/tmp/moe-synthetic-$LAYERS.gguf
step "write the synthetic MoE ($LAYERS layers) to $MODEL"
[ -s "$MODEL" ] || "$PY" -P -c "
import sys; sys.path.insert(0, 'bench')
from pathlib import Path
import moe_synthetic as ms
ms.SHAPE['n_layers'] = $LAYERS
ms.write_model(Path('$MODEL'))
" || { echo "could not write the model"; exit 1; }
ls -l "$MODEL"

# Budgets: everything (the file is smaller than the GPU), and about half the experts (the route split). A size
# below the placement's minimum is refused by name, which the log then shows.
SIZE=$(stat -c %s "$MODEL")
HALF=$(( SIZE / 2 ))
run() {  # run LABEL ARGS...: one `pyinfer bench --json` object, tagged, appended to OUTDIR/moe_runs.jsonl
  local label=$1; shift
  step "$label"
  timeout 240 "$PY" -P -m pyinfer.cli bench -m "$MODEL" -p 128 -g 32 -r 2 -c 512 --json "$@" \
    | "$PY" -c "import json, sys; d = json.loads(sys.stdin.read()); d['run'] = '$label'; print(json.dumps(d))" \
    | tee -a "$OUT/moe_runs.jsonl"
}
run "cpu, $THREADS threads" -t "$THREADS"
run "$DEVICE, every expert" --device "$DEVICE" --vram-budget "$(( SIZE + (2 << 30) ))" -t "$THREADS"
run "$DEVICE, about half the experts" --device "$DEVICE" --vram-budget "$HALF" -t "$THREADS"
step "done: tests rc=$TESTS"
exit $TESTS
