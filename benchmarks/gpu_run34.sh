#!/usr/bin/env bash
# Thirty-fourth GPU call: after the review (gemv_mma calls pdl.enter and gemv_split.store_rows instead of
# Gluon copies; Q4KPlane.words()): the GEMV tests, the model-level decode tests, tg128 of the 7B.
source benchmarks/gpu_setup.sh
timeout 90 python3 -m pytest -q -p no:cacheprovider -m cuda plugins/mmq_triton/tests/test_decode_mma.py \
  plugins/mmq_triton/tests/test_decode_gemv.py 2>&1 | tail -2 | tee "$OUT/gpu-tests.log"
timeout 50 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py \
  2>&1 | tail -2 | tee -a "$OUT/gpu-tests.log"
timeout 40 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | tee "$OUT/bench7b.md"
