#!/usr/bin/env bash
# Second GPU call: new GPU tests, the gate sweep on the 7B, the 0.5B, parity and decode neutrality.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
[ -f /tmp/7b.gguf ] || minfer synth models/qwen2-7b-q4_k_m.layout.gguf.xz /tmp/7b.gguf 2>&1 | tail -1
[ -f /tmp/05b.gguf ] || minfer synth models/qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz /tmp/05b.gguf 2>&1 | tail -1
timeout 150 python3 -m pytest -m cuda -q -x -p no:cacheprovider plugins/mmq_triton/tests/test_decode_fused.py \
  tests/test_kernels_e2e.py 2>&1 | tail -8 | tee "$OUT/gpu-tests2.log"
minfer bench -m /tmp/7b.gguf -p 512,3314 -n 128 -r 3 --memory --gates --config plugin=no:cuda_graphs \
  --config MINFER_MMQ_Q6K_EXP=0 --config MINFER_MMQ_Q4K_DSC=0 2>"$OUT/sweep7b.err" | tee "$OUT/sweep7b.md"
minfer bench -m /tmp/05b.gguf -p 512,3314 -n 128 -r 3 --memory --config default --config MINFER_MMQ=0 \
  --config plugin=no:cuda_graphs 2>"$OUT/bench05b.err" | tee "$OUT/bench05b.md"
G="MINFER_MMQ MINFER_MMQ_RAW MINFER_MMQ_RAW_NB MINFER_MMQ_A_TRANSPOSE MINFER_MMQ_Q6K_NB MINFER_MMQ_A_FUSE"
cfgs=(--config default --config "$(echo $G | sed 's/\([A-Z_]*\)/\1=1/g; s/ /,/g; s/A_FUSE=1/A_FUSE=2/')")
for g in $G; do cfgs+=(--config "$g=0"); done
minfer parity -m /tmp/7b.gguf -p "The quick brown fox" -n 128 "${cfgs[@]}" 2>"$OUT/parity7b.err" | tee "$OUT/parity7b.txt"
minfer parity -m /tmp/7b.gguf -p "The quick brown fox" -n 32 --config default --config backend=reference \
  2>>"$OUT/parity7b.err" | tee -a "$OUT/parity7b.txt"
minfer parity -m /tmp/7b.gguf -p "$(python3 -c 'print("The history of computing is long. " * 60)')" -n 8 --config default --config backend=reference \
  2>>"$OUT/parity7b.err" | tee -a "$OUT/parity7b.txt"
