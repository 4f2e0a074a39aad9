#!/usr/bin/env bash
# Third GPU call: every cuda-marked test plus the GPU side of the CPU tests that take a device
# (decode neutrality over 128 tokens for each gate, the model vs the reference), and parity of the
# default against all six gates set explicitly on.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
[ -f /tmp/7b.gguf ] || minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1
timeout 300 python3 -m pytest -m "cuda" -q -p no:cacheprovider -k "not test_real" 2>&1 | tail -15 | tee "$OUT/gpu-tests-all.log"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m "not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py 2>&1 | tail -5 | tee "$OUT/gpu-neutrality.log"
minfer parity -m /tmp/7b.gguf -p "The quick brown fox" -n 128 2>"$OUT/parity.err" | tee "$OUT/parity-allon.txt"
minfer gates -m /tmp/7b.gguf 2>&1 | tee "$OUT/gates7b.txt" | tail -30
