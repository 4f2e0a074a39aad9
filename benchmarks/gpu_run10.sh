#!/usr/bin/env bash
# Tenth GPU call: the prefill RoPE + KV kernel. Every cuda test, the model tests on the GPU, parity
# of the default with the reference, and the default bench of both models.
source benchmarks/gpu_setup.sh
timeout 150 python3 -m pytest -m cuda -q -p no:cacheprovider -k "not test_real" 2>&1 | tail -4 | tee "$OUT/gpu-tests.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m "not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py \
  tests/test_prefill_step.py plugins/mmq_triton/tests/test_decode_fused.py 2>&1 | tail -4 | tee "$OUT/gpu-model-tests.log"
timeout 90 minfer bench -m /tmp/7b.gguf -p 512,3314 -n 128 -r 5 --memory 2>"$OUT/bench7b.err" | tee "$OUT/bench7b.md"
timeout 60 minfer bench -m /tmp/05b.gguf -p 512,3314 -n 128 -r 5 --memory 2>"$OUT/bench05b.err" | tee "$OUT/bench05b.md"
for reps in 12 60; do
  timeout 60 minfer parity -m /tmp/7b.gguf -p "$(python3 -c "print('The history of computing is long. ' * $reps)")" -n 16 \
    --config default --config backend=reference 2>>"$OUT/parity7b.err" | tee -a "$OUT/parity7b.txt"
done
