# Sourced by the gpu_run*.sh scripts on the GPU machine: install minfer (editable) and the carried
# gguf wheel, and synthesize the two benchmark models (/tmp/7b.gguf, /tmp/05b.gguf; not with SYNTH=0). Sets OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
if [ "${SYNTH:-1}" != 0 ]; then  # SYNTH=0: no models needed
  minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1 &
  minfer synth models/qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz /tmp/05b.gguf 2>&1 | tail -1
  wait
fi
