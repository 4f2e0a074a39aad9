#!/usr/bin/env bash
# Thirtieth GPU call: the q6_K tensor-core GEMV (gemv_mma) checked against gguf and swept at the 7B's
# q6_K shapes (ffn_down, output head); tg128 of the 7B with the run-29 q4_K MMA configs.
source benchmarks/gpu_setup.sh
timeout 120 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 --config default --config MINFER_DECODE_MMA=0 \
  2>"$OUT/bench7b.err" | tee "$OUT/bench7b.md"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider -m cuda plugins/mmq_triton/tests/test_decode_ring.py 2>&1 \
  | tail -25 | tee "$OUT/gpu-tests.log"
timeout 200 python3 benchmarks/sweep_ring.py --q6 2>&1 | tee "$OUT/sweep-q6.txt"
