#!/usr/bin/env bash
# Fifth GPU call: decode GEMV sweep (tiles, num_stages, int8 vs float for qkv/o), GPU tests of the
# prefill graphs and the fused decode pieces, and a first bench of both models.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1 &
minfer synth models/qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz /tmp/05b.gguf 2>&1 | tail -1 &
timeout 230 python3 benchmarks/sweep_gemv.py ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.txt"
wait
timeout 150 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" plugins/cuda_graphs/tests tests/test_kernels_e2e.py \
  tests/test_prefill_step.py plugins/mmq_triton/tests/test_decode_gemv.py -k "cuda or fused or prefill or graph or Graph or replay" 2>&1 | tail -12 | tee "$OUT/tests.txt"
timeout 130 minfer bench -m /tmp/7b.gguf -p 512,3314 -n 128 -r 5 --memory 2>"$OUT/bench7b.err" | tee "$OUT/bench7b.md"
timeout 60 minfer bench -m /tmp/05b.gguf -p 512,3314 -n 128 -r 5 --memory 2>"$OUT/bench05b.err" | tee "$OUT/bench05b.md"
tail -3 "$OUT"/*.err
