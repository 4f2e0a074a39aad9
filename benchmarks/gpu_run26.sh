#!/usr/bin/env bash
# Twenty-sixth GPU call: the whole GPU test suite on the session's final code, and one more tg128 reading
# of both models (run-to-run spread).
source benchmarks/gpu_setup.sh
for m in 05b 7b; do
  timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | tee -a "$OUT/bench.md"
done
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda -k "not test_real" 2>&1 | tail -4 | tee "$OUT/gpu-tests.log"
