#!/usr/bin/env bash
# Fourteenth GPU call: PDL prefetch settings (lines per row; only the first ~8 programs per SM).
# (MINFER_PDL_PF / MINFER_PDL_PFB / MINFER_PDL_TRIG / MINFER_PDL_MAXP were temporary knobs of this experiment,
# removed after it: pdl.PREFETCH_LINES / PREFETCH_MAX_VALUES hold the chosen setting.)
source benchmarks/gpu_setup.sh
for m in 7b 05b; do
  for v in "0 0" "2 0" "2 1056" "4 1056" "8 1056" "16 1056"; do
    set -- $v
    MINFER_PDL_PF=$1 MINFER_PDL_PFB=$2 timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | sed "s/^/pf=$1 below=$2 /" | tee -a "$OUT/bench.md"
  done
done
