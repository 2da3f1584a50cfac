#!/usr/bin/env bash
# Issue 12's 7B figure: bench/hybrid.py on the LLaMA-7B-shaped synthetic model (Q4_0, random weights, ReLU-like
# firing, ~10% of FFN neurons per token with power-law frequencies, oracle predictors; written on the machine:
# 3.8 GB cannot travel) at a VRAM budget of 50% of its FFN: hybrid against CPU-only pyinfer, the GPU alone and
# the torch peer with half its blocks on the GPU. Run it after check.sh on the same warm machine (the build is
# reused) or alone (it builds). Writes a log, JSON, markdown and the timeline plot to OUTDIR.
#
#   bash bench/gpu/synthetic7b.sh OUTDIR
# Without a GPU it runs a 2-layer model of the same width on the stand-in (its CPU half).
set -uo pipefail
OUT="${1:?usage: bash bench/gpu/synthetic7b.sh OUTDIR}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
exec > >(tee "$OUT/synthetic7b.log") 2>&1
source bench/gpu/setup.sh
if [ "$GPU" = 1 ]; then
  ARGS="--device cuda --threads 8 --rounds 3 --tokens 16 --variants --peer layers accelerate"
else
  ARGS="--device standin --threads 1 --rounds 1 --tokens 4 --peer layers --synthetic-layers 2"
fi
echo "== $(date +%T) LLaMA-7B-shaped synthetic model, hybrid at 50% of the FFN"
timeout 420 "$PY" bench/hybrid.py --synthetic-7b /tmp/synthetic7b $ARGS --shares 0.5 --ctx 512 --out "$OUT" \
  --tag hybrid_synthetic7b
RC=$?
echo "== $(date +%T) done: rc=$RC"
exit $RC
