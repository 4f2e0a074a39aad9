#!/usr/bin/env bash
# Nineteenth GPU call: tg128 on both models with RMSNorm and SwiGLU inside the float GEMVs, where the
# decode step's time goes kernel by kernel (step_timeline.py), and the whole GPU test suite (also the
# first GPU run of the previous session's last tidy commits).
source benchmarks/gpu_setup.sh
MINFER_TMP_I8ROLES=qkv,gate_up,output timeout 60 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | sed 's/^/old-int8-roles /' | tee -a "$OUT/bench.md"
for m in 7b 05b; do
  timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | tee -a "$OUT/bench.md"
  timeout 60 python3 benchmarks/step_timeline.py /tmp/$m.gguf --top 45 2>&1 | grep -v Warn | tee "$OUT/timeline-$m.txt"
done
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda -k "not test_real" 2>&1 | tail -8 | tee "$OUT/gpu-tests.log"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py 2>&1 | tail -4 | tee -a "$OUT/gpu-tests.log"
