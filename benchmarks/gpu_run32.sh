#!/usr/bin/env bash
# Thirty-second GPU call: the session's final code (MMA GEMVs without the ring kernel and the prefetch
# option). The whole GPU suite, decode neutrality in speed (tg128 with each gate at "0", `bench --gates`)
# for both models, parity.
source benchmarks/gpu_setup.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda -k "not test_real" 2>&1 | tail -3 | tee "$OUT/gpu-tests.log"
timeout 60 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py \
  2>&1 | tail -2 | tee -a "$OUT/gpu-tests.log"
timeout 170 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 --gates 2>"$OUT/gates7b.err" | tee "$OUT/gates7b.md"
timeout 80 minfer bench -m /tmp/05b.gguf -p 0 -n 128 -r 3 --gates 2>"$OUT/gates05b.err" | tee "$OUT/gates05b.md"
timeout 40 minfer parity -m /tmp/7b.gguf -p "The quick brown fox" -n 128 2>"$OUT/parity.err" | head -2 | tee "$OUT/parity-allon.txt"
