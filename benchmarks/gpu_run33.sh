#!/usr/bin/env bash
# Thirty-third GPU call: after a restructuring of the q4_K MMA loop (no change in the SASS's size), its
# GPU tests, the model-level decode tests and tg128 of the 7B once more.
source benchmarks/gpu_setup.sh
timeout 100 python3 -m pytest -q -p no:cacheprovider -m cuda plugins/mmq_triton/tests/test_decode_mma.py 2>&1 | tail -2 | tee "$OUT/gpu-tests.log"
timeout 60 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py \
  2>&1 | tail -2 | tee -a "$OUT/gpu-tests.log"
timeout 60 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | tee "$OUT/bench7b.md"
