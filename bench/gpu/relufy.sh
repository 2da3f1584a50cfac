#!/usr/bin/env bash
# Issue 13's GPU run: ReLU-fy SmolLM2-135M on one GPU for as many tokens as fit in MINUTES (default 9) of
# training, then write the FFN-only GGUF (cut into parts of 15 MiB: files come back at most 16 MiB each;
# `cat ffn.gguf.part-* > ffn.gguf` joins them) and a JSON of figures to OUTDIR.
#
# The 92 MB model file cannot travel in one call (the working tree is limited to 64 MiB). Here:
#   split -b 48M $(python3 -c "from pyinfer.model.pull import resolve_model; print(resolve_model(None))") .model/part-
#   mkdir -p shared-data && cp ../shared/data/{pride-and-prejudice,tinyshakespeare}.txt shared-data/  (ignored)
# then two calls back to back (the machine stays warm between them): the first carries .model/part-aa and runs
# `bash bench/gpu/relufy.sh --stage`, which keeps the part in /tmp; the second carries .model/part-ab, shared-data
# and .whl and runs `bash bench/gpu/relufy.sh $OUT`.
#
#   bash bench/gpu/relufy.sh OUTDIR [MINUTES]
# Without a GPU it runs its CPU half (a short CPU run; MODEL=path and DATA=folder point at local files).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/model_parts.sh "$@"
OUT="${1:?usage: bash bench/gpu/relufy.sh OUTDIR [MINUTES]}"
MINUTES="${2:-9}"
mkdir -p "$OUT"
exec > >(tee "$OUT/relufy.log") 2>&1
# the wheels and the build come from setup.sh: a machine warm from check.sh reuses that build
source bench/gpu/setup.sh
join_model
# Without a GPU (the script's CPU half): a short run on the CPU with small batches.
DEVICE=cuda; SHAPE="--seq-len 512 --batch 32"; SELF=4000; THREADS=8
if ! nvidia-smi --query-gpu=name --format=csv,noheader; then
  DEVICE=cpu; SHAPE="--seq-len 128 --batch 4"; SELF=0; THREADS=2
fi
DATA="${DATA:-shared-data}"
"$PY" -P -m pyinfer.cli relufy -m "$MODEL" -t "$THREADS" -o /tmp/ffn.gguf --ffn-only --device "$DEVICE" \
  --minutes "$MINUTES" --tokens 1000000000 $SHAPE --lr 1e-4 --l1 1e-3 --target-sparsity 0.9 \
  --data "$DATA/pride-and-prejudice.txt" "$DATA/tinyshakespeare.txt" --self-text "$SELF" --json \
  > "$OUT/relufy.json" || exit 1
cp /tmp/ffn.gguf.curve.json "$OUT/"
split -b 15M /tmp/ffn.gguf "$OUT/ffn.gguf.part-"
ls -la "$OUT"
