# Sourced by the GPU scripts on the GPU machine (repo root): installs minfer (editable) and the carried
# gguf wheel (.carry/whl), synthesizes the two benchmark models /tmp/7b.gguf and /tmp/05b.gguf from the
# layout templates in models/ (not with SYNTH=0), and, when the anchors folder travelled with the
# checkout (anchors/ or .carry/anchors/, from /work/shared/anchors), starts the llama.cpp build in the
# background (LLAMA_DIR, default /tmp/llamacpp; binaries in $LLAMA_DIR/b/bin). Sets OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LLAMA_DIR=${LLAMA_DIR:-/tmp/llamacpp}
for a in anchors .carry/anchors; do
  if [ -f "$a/build_llamacpp.sh" ] && [ ! -f "$LLAMA_DIR/build.log" ]; then
    bash "$a/build_llamacpp.sh" "$LLAMA_DIR" & break
  fi
done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
if [ "${SYNTH:-1}" != 0 ]; then
  [ -f /tmp/7b.gguf ] || minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1 &
  synth_pid=$!
  [ -f /tmp/05b.gguf ] || minfer synth models/qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz /tmp/05b.gguf 2>&1 | tail -1
  wait "$synth_pid"
fi

# wait_llama: block until the background llama.cpp build has finished (its log ends in BUILD_RC=).
wait_llama() {
  [ -f "$LLAMA_DIR/build.log" ] || return 1
  until grep -q BUILD_RC= "$LLAMA_DIR/build.log"; do sleep 5; done
  grep -q BUILD_RC=0 "$LLAMA_DIR/build.log"
}
