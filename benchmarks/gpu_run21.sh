#!/usr/bin/env bash
# Twenty-first GPU call: tg128 with SwiGLU in the float GEMVs and the one-step legacy / split q4_K float
# tiles, the 0.5B step's kernel timeline, a split-K sweep of the 7B's ffn_down GEMVs (caps up to 16),
# and the GPU tests of the decode path.
source benchmarks/gpu_setup.sh
for m in 7b 05b; do
  timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | tee -a "$OUT/bench.md"
done
timeout 60 python3 benchmarks/step_timeline.py /tmp/05b.gguf --top 30 2>&1 | grep -v Warn | tee "$OUT/timeline-05b.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_pdl.py plugins/mmq_triton/tests plugins/cuda_graphs/tests 2>&1 | tail -4 | tee "$OUT/gpu-tests.log"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py 2>&1 | tail -4 | tee -a "$OUT/gpu-tests.log"
timeout 200 python3 benchmarks/sweep_gemv.py --roles down --max-split 16 2>&1 | grep -v Warn | tee "$OUT/sweep-down.txt"
