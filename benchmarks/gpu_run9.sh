#!/usr/bin/env bash
# Ninth GPU call (final, part 2): the 0.5B bench, parity on the 7B (gates, reference at three prompt
# lengths), and the decode kernel table of the 7B.
source benchmarks/gpu_setup.sh
timeout 100 minfer bench -m /tmp/05b.gguf -p 512,3314 -n 128 -r 5 --memory --config default --config MINFER_MMQ=0 \
  --config plugin=no:cuda_graphs 2>"$OUT/bench05b.err" | tee "$OUT/bench05b.md"
G="MINFER_MMQ MINFER_MMQ_RAW MINFER_MMQ_RAW_NB MINFER_MMQ_A_TRANSPOSE MINFER_MMQ_Q6K_NB MINFER_MMQ_A_FUSE"
cfgs=(--config default --config "MINFER_MMQ=1,MINFER_MMQ_RAW=1,MINFER_MMQ_RAW_NB=1,MINFER_MMQ_A_TRANSPOSE=1,MINFER_MMQ_Q6K_NB=1,MINFER_MMQ_A_FUSE=2")
for g in $G; do cfgs+=(--config "$g=0"); done
timeout 150 minfer parity -m /tmp/7b.gguf -p "The quick brown fox" -n 128 "${cfgs[@]}" 2>"$OUT/parity7b.err" | tee "$OUT/parity7b.txt"
for reps in 1 12 60; do
  timeout 60 minfer parity -m /tmp/7b.gguf -p "$(python3 -c "print('The history of computing is long. ' * $reps)")" -n 16 \
    --config default --config backend=reference 2>>"$OUT/parity7b.err" | tee -a "$OUT/parity7b.txt"
done
timeout 60 python3 benchmarks/profile_step.py /tmp/7b.gguf --pp 512 --reps 2 --top 25 2>&1 | tail -32 | tee "$OUT/profile7b.txt"
