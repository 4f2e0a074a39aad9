#!/usr/bin/env bash
# Twenty-third GPU call: the q4_K int8 GEMV with the next step's weights requested before this step's
# arithmetic (temporary knob MINFER_TMP_AHEAD) against without, over its tiles (temporary knob
# MINFER_TMP_Q4CFG for the 7B's gate_up / qkv tile): tg128 on the 7B and a sweep of gate_up and down.
source benchmarks/gpu_setup.sh
for v in "0 16,4,2" "1 8,4,4" "1 16,2,2" "0 8,4,4"; do
  set -- $v
  MINFER_TMP_AHEAD=$1 MINFER_TMP_Q4CFG=$2 timeout 60 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | sed "s/^/ahead=$1 cfg=$2 /" | tee -a "$OUT/bench.md"
done
for a in 0 1; do
  echo "# AHEAD=$a" | tee -a "$OUT/sweep.txt"
  MINFER_TMP_AHEAD=$a timeout 150 python3 benchmarks/sweep_gemv.py --types Q4_K --roles gate_up,down --tiles "8,4,4 16,4,2 16,2,2 8,8,4 16,4,4 8,2,2 16,8,4 4,4,2" 2>&1 | grep -v Warn | tee -a "$OUT/sweep.txt"
done
