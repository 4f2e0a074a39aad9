#!/usr/bin/env bash
# Eighteenth GPU call: which of run 17's two kernel edits cost speed (temporary knobs: MINFER_Q6HOIST,
# the q6_K int8 GEMV loading a step's scales up front; MINFER_Q4FSC, the float q4_K GEMV loading scale
# words with its quant bytes), and the GPU tests of the decode path with their full summary.
source benchmarks/gpu_setup.sh
for m in 7b 05b; do
  for v in "1 1" "0 1" "1 0" "0 0"; do
    set -- $v
    MINFER_Q6HOIST=$1 MINFER_Q4FSC=$2 timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | sed "s/^/q6hoist=$1 q4fsc=$2 /" | tee -a "$OUT/bench.md"
  done
done
timeout 120 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_pdl.py plugins/mmq_triton/tests plugins/cuda_graphs/tests 2>&1 | tail -6 | tee "$OUT/gpu-tests.log"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py 2>&1 | tail -6 | tee -a "$OUT/gpu-tests.log"
