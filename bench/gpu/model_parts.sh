# Sourced (with the script's arguments) by the GPU scripts that need the real SmolLM2 file: its 92 MB do not fit
# one call (64 MiB), so it travels as .model/part-* over back-to-back calls. Each call copies the parts it carries
# to /tmp, where they stay while the machine is warm; a first argument `--stage` stops the script there.
# join_model sets MODEL (default /tmp/smollm2.gguf) to the joined file.
PARTS=/tmp/pyinfer-model-parts
mkdir -p "$PARTS"
cp -n .model/part-* "$PARTS"/ 2>/dev/null || true
if [ "${1:-}" = "--stage" ]; then ls -la "$PARTS"; exit 0; fi
join_model() {
  MODEL="${MODEL:-/tmp/smollm2.gguf}"
  [ -f "$MODEL" ] || cat "$PARTS"/part-* > "$MODEL"
  echo "model $MODEL: $(sha256sum "$MODEL" | cut -c1-16)…, $(stat -c %s "$MODEL") bytes"
}
