#!/usr/bin/env bash
# Seventh GPU call: sweep of the q4_K plane GEMVs, every cuda test, a first bench of the 7B decode.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1 &
timeout 200 python3 benchmarks/sweep_gemv.py --types Q4_K 2>&1 | tee "$OUT/sweep3.txt"
wait
timeout 240 python3 -m pytest -m cuda -q -p no:cacheprovider -x -k "not test_real" 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"
timeout 100 minfer bench -m /tmp/7b.gguf -p 512 -n 128 -r 3 --memory 2>"$OUT/bench7b.err" | tee "$OUT/bench7b.md"
tail -3 "$OUT/bench7b.err"
