#!/usr/bin/env bash
# Twelfth GPU call: programmatic dependent launch (PDL) in the decode kernels. Bitwise test of
# PDL on vs off, the decode kernel tests, then tg128 of both models with PDL on and off.
source benchmarks/gpu_setup.sh
timeout 120 python3 -m pytest -m cuda -q -p no:cacheprovider tests/test_pdl.py plugins/mmq_triton/tests/test_decode_gemv.py \
  plugins/mmq_triton/tests/test_decode_attention.py plugins/mmq_triton/tests/test_decode_fused.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"
for m in 05b 7b; do
  timeout 120 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 5 --memory --config default --config MINFER_PDL=0 \
    2>"$OUT/bench$m.err" | tee "$OUT/bench$m.md"
  tail -3 "$OUT/bench$m.err"
done
