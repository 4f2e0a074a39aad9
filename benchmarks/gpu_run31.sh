#!/usr/bin/env bash
# Thirty-first GPU call (final of this session): q4_K and q6_K int8 decode GEMVs on tensor cores
# (MODE 3). tg128/pp512 of both models under the default, MINFER_MMQ=0, graphs off, PDL off and the
# dp4a kernels (MINFER_DECODE_MMA=0), memory after load and peak; the GPU suite; parity; the 7B's step.
source benchmarks/gpu_setup.sh
CFGS="--config default --config MINFER_MMQ=0 --config plugin=no:cuda_graphs --config MINFER_PDL=0 --config MINFER_DECODE_MMA=0"
timeout 170 minfer bench -m /tmp/7b.gguf -p 512 -n 128 -r 3 --memory $CFGS 2>"$OUT/bench7b.err" | tee "$OUT/bench7b.md"
timeout 70 minfer bench -m /tmp/05b.gguf -p 512 -n 128 -r 3 --memory $CFGS 2>"$OUT/bench05b.err" | tee "$OUT/bench05b.md"
timeout 170 python3 -m pytest -q -p no:cacheprovider -m cuda -k "not test_real" 2>&1 | tail -4 | tee "$OUT/gpu-tests.log"
timeout 60 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py \
  2>&1 | tail -3 | tee -a "$OUT/gpu-tests.log"
timeout 40 minfer parity -m /tmp/7b.gguf -p "The quick brown fox" -n 128 2>"$OUT/parity.err" | head -2 | tee "$OUT/parity-allon.txt"
timeout 40 minfer parity -m /tmp/7b.gguf -p "$(python3 -c "print('The history of computing is long. ' * 12)")" -n 16 \
  --config default --config backend=reference 2>>"$OUT/parity.err" | head -3 | tee "$OUT/parity-ref.txt"
timeout 40 python3 benchmarks/step_timeline.py /tmp/7b.gguf --tokens 8 --top 16 2>&1 | tail -18 | tee "$OUT/timeline7b.txt"
