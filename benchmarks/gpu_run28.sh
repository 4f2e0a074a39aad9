#!/usr/bin/env bash
# Twenty-eighth GPU call: the tensor-core q4_K GEMV (MODE 3) in the model. tg128 of the 7B with it
# and without (MINFER_DECODE_MMA=0), the Gluon GEMV tests and the model-level GPU tests, how fast
# the 7B's matrices can be read at all (read_roofline.py), and the 7B step's kernel timeline.
source benchmarks/gpu_setup.sh
timeout 120 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 --config default --config MINFER_DECODE_MMA=0 \
  2>"$OUT/bench7b.err" | tee "$OUT/bench7b.md"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda plugins/mmq_triton/tests/test_decode_ring.py \
  plugins/mmq_triton/tests/test_decode_gemv.py 2>&1 | tail -4 | tee "$OUT/gpu-tests.log"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py \
  2>&1 | tail -4 | tee -a "$OUT/gpu-tests.log"
timeout 100 python3 benchmarks/read_roofline.py 2>&1 | tee "$OUT/roofline.txt"
timeout 100 python3 benchmarks/step_timeline.py /tmp/7b.gguf --tokens 8 --top 30 2>&1 | tail -34 | tee "$OUT/timeline7b.txt"
