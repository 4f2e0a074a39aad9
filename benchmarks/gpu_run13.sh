#!/usr/bin/env bash
# Thirteenth GPU call: PDL variants. The graph-mode bitwise test, then tg128 of both models with
# (MINFER_PDL_PF / MINFER_PDL_PFB / MINFER_PDL_TRIG / MINFER_PDL_MAXP were temporary knobs of this experiment,
# removed after it: pdl.PREFETCH_LINES / PREFETCH_MAX_VALUES hold the chosen setting.)
# L2 prefetch of 0/2/4/16 lines per row, with PDL only for weights under 32M values, and PDL off.
source benchmarks/gpu_setup.sh
for m in 7b 05b; do
  for pf in 0 2 4 16; do
    MINFER_PDL_PF=$pf timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 --config "MINFER_PDL=1" 2>/dev/null | grep tg128 | sed "s/^/pf=$pf /" | tee -a "$OUT/bench.md"
  done
  MINFER_PDL_TRIG=0 MINFER_PDL_PF=4 timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 --config "MINFER_PDL=1" 2>/dev/null | grep tg128 | sed "s/^/notrig pf=4 /" | tee -a "$OUT/bench.md"
  MINFER_PDL_PF=4 timeout 90 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 --config MINFER_PDL_MAXP=33554432 \
    --config MINFER_PDL_MAXP=8388608 --config MINFER_PDL=0 2>/dev/null | grep tg128 | tee -a "$OUT/bench.md"
done
