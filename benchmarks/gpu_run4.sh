#!/usr/bin/env bash
# Fourth GPU call: where the time goes (kernel tables for prefill and decode, per-rep prefill times).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
s=$(date +%s)
[ -f /tmp/7b.gguf ] || minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1
[ -f /tmp/05b.gguf ] || minfer synth models/qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz /tmp/05b.gguf 2>&1 | tail -1
echo "synth took $(( $(date +%s) - s )) s"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv
python3 benchmarks/profile_step.py /tmp/7b.gguf --pp 512 --top 40 2>&1 | tee "$OUT/profile7b.txt"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv
python3 benchmarks/profile_step.py /tmp/05b.gguf --pp 512 --top 30 2>&1 | tee "$OUT/profile05b.txt"
