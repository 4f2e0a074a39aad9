#!/usr/bin/env bash
# Fifteenth GPU call: the chosen PDL setting, and two decode experiments on top of it: x as one
# int8 digit instead of two (MINFER_X1=1) and capped split-K (MINFER_MAXSPLIT); temporary knobs.
source benchmarks/gpu_setup.sh
for m in 05b 7b; do
  for v in "MINFER_X1=0" "MINFER_X1=1" "MINFER_MAXSPLIT=1" "MINFER_MAXSPLIT=4" "MINFER_PDL=0"; do
    env $v timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | sed "s/^/$v /" | tee -a "$OUT/bench.md"
  done
done
