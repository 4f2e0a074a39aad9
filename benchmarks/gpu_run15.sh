#!/usr/bin/env bash
# Fifteenth GPU call: the chosen PDL setting, and two decode experiments on top of it: x as one
# int8 digit instead of two (MINFER_X1=1) and capped split-K (MINFER_MAXSPLIT); temporary knobs.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1 &
minfer synth models/qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz /tmp/05b.gguf 2>&1 | tail -1
wait
for m in 05b 7b; do
  for v in "MINFER_X1=0" "MINFER_X1=1" "MINFER_MAXSPLIT=1" "MINFER_MAXSPLIT=4" "MINFER_PDL=0"; do
    env $v timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | sed "s/^/$v /" | tee -a "$OUT/bench.md"
  done
done
