#!/usr/bin/env bash
# Eighth GPU call (final, part 1): every cuda test, the CPU-marked model tests on the GPU, and the
# 7B bench: default, each gate at "0", both plane builders off, graphs off; memory both ways.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1
timeout 150 python3 -m pytest -m cuda -q -p no:cacheprovider -k "not test_real" 2>&1 | tail -4 | tee "$OUT/gpu-tests.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m "not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py \
  tests/test_prefill_step.py 2>&1 | tail -4 | tee "$OUT/gpu-model-tests.log"
timeout 280 minfer bench -m /tmp/7b.gguf -p 512,3314 -n 128 -r 5 --memory --gates --config MINFER_MMQ_Q6K_EXP=0 \
  --config MINFER_MMQ_Q4K_DSC=0 --config plugin=no:cuda_graphs 2>"$OUT/sweep7b.err" | tee "$OUT/sweep7b.md"
grep -v "load:" "$OUT/sweep7b.err" | tail -5
