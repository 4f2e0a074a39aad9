#!/usr/bin/env bash
# Thirteenth GPU call: PDL variants. The graph-mode bitwise test, then tg128 of both models with
# (MINFER_PDL_PF / MINFER_PDL_PFB / MINFER_PDL_TRIG / MINFER_PDL_MAXP were temporary knobs of this experiment,
# removed after it: pdl.PREFETCH_LINES / PREFETCH_MAX_VALUES hold the chosen setting.)
# L2 prefetch of 0/2/4/16 lines per row, with PDL only for weights under 32M values, and PDL off.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1 &
minfer synth models/qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz /tmp/05b.gguf 2>&1 | tail -1
wait
for m in 7b 05b; do
  for pf in 0 2 4 16; do
    MINFER_PDL_PF=$pf timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 --config "MINFER_PDL=1" 2>/dev/null | grep tg128 | sed "s/^/pf=$pf /" | tee -a "$OUT/bench.md"
  done
  MINFER_PDL_TRIG=0 MINFER_PDL_PF=4 timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 --config "MINFER_PDL=1" 2>/dev/null | grep tg128 | sed "s/^/notrig pf=4 /" | tee -a "$OUT/bench.md"
  MINFER_PDL_PF=4 timeout 90 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 --config MINFER_PDL_MAXP=33554432 \
    --config MINFER_PDL_MAXP=8388608 --config MINFER_PDL=0 2>/dev/null | grep tg128 | tee -a "$OUT/bench.md"
done
