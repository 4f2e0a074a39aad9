#!/usr/bin/env bash
# Sixteenth GPU call: the q4_K int8 GEMV loading each step's weights one step ahead (MINFER_AHEAD)
# and/or prefetching to L2 DIST steps ahead (MINFER_DIST); temporary knobs of this experiment.
source benchmarks/gpu_setup.sh
TRITON_INTERPRET=0 timeout 100 python3 -m pytest -m cuda -q -p no:cacheprovider plugins/mmq_triton/tests/test_decode_gemv.py 2>&1 | tail -2
for v in "0 0" "1 0" "0 2" "0 4" "1 2" "1 4"; do
  set -- $v
  MINFER_AHEAD=$1 MINFER_DIST=$2 timeout 60 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | sed "s/^/ahead=$1 dist=$2 /" | tee -a "$OUT/bench.md"
done
for v in "0 0" "1 0" "1 2"; do
  set -- $v
  MINFER_AHEAD=$1 MINFER_DIST=$2 timeout 60 minfer bench -m /tmp/05b.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | sed "s/^/ahead=$1 dist=$2 /" | tee -a "$OUT/bench.md"
done
