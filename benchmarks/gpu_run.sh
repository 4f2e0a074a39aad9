#!/usr/bin/env bash
# One call on the GPU machine: install, synthesize the two models, GPU tests, benchmarks, parity.
# Usage (device tool, repo root, carry .carry with the gguf wheel): bash benchmarks/gpu_run.sh [tests|bench|all]
set -o pipefail
export PYTHONUNBUFFERED=1
what=${1:-all}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
[ -f /tmp/7b.gguf ] || minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1
[ -f /tmp/05b.gguf ] || minfer synth models/qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz /tmp/05b.gguf 2>&1 | tail -1
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout 240 python3 -m pytest -m cuda -q -x -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/gpu-tests.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  minfer bench -m /tmp/7b.gguf -p 512,3314 -n 128 -r 5 --memory --config default --config MINFER_MMQ=0 \
    --config plugin=no:cuda_graphs 2>"$OUT/bench7b.err" | tee "$OUT/bench7b.md"
  minfer bench -m /tmp/05b.gguf -p 512,3314 -n 128 -r 5 --memory --config default --config MINFER_MMQ=0 \
    --config plugin=no:cuda_graphs 2>"$OUT/bench05b.err" | tee "$OUT/bench05b.md"
fi
