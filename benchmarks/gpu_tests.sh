#!/usr/bin/env bash
# The GPU test suite on the GPU machine (carry .carry): every cuda-marked test, then the model-level
# decode tests and the prefill GEMM / plane tests (unmarked: they take the GPU when there is one).
# Logs in $OUT/gpu-tests.log.
SYNTH=0 source benchmarks/gpu_setup.sh
timeout 300 python3 -m pytest -q -p no:cacheprovider -m cuda -k "not test_real" 2>&1 | tail -5 | tee "$OUT/gpu-tests.log"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py \
  tests/test_kernels_e2e.py 2>&1 | tail -3 | tee -a "$OUT/gpu-tests.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" plugins/mmq_triton/tests/test_mmq_gemm.py \
  plugins/mmq_triton/tests/test_mmq_planes.py 2>&1 | tail -3 | tee -a "$OUT/gpu-tests.log"
