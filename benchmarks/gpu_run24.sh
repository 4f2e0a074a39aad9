#!/usr/bin/env bash
# Twenty-fourth GPU call (final of this session): SwiGLU in the float GEMVs and the one-step legacy /
# narrow q4_K float tiles checked and measured. GPU tests of the decode path, tg128/pp512 of both models
# under the default, MINFER_MMQ=0, graphs off and PDL off (memory after load and peak), parity.
source benchmarks/gpu_setup.sh
CFGS="--config default --config MINFER_MMQ=0 --config plugin=no:cuda_graphs --config MINFER_PDL=0"
timeout 150 minfer bench -m /tmp/7b.gguf -p 512 -n 128 -r 3 --memory $CFGS 2>"$OUT/bench7b.err" | tee "$OUT/bench7b.md"
timeout 60 minfer bench -m /tmp/05b.gguf -p 512 -n 128 -r 3 --memory $CFGS 2>"$OUT/bench05b.err" | tee "$OUT/bench05b.md"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_pdl.py plugins/mmq_triton/tests plugins/cuda_graphs/tests \
  2>&1 | tail -4 | tee "$OUT/gpu-tests.log"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py \
  2>&1 | tail -4 | tee -a "$OUT/gpu-tests.log"
timeout 60 minfer parity -m /tmp/7b.gguf -p "The quick brown fox" -n 128 2>"$OUT/parity.err" | head -2 | tee "$OUT/parity-allon.txt"
timeout 60 minfer parity -m /tmp/7b.gguf -p "$(python3 -c "print('The history of computing is long. ' * 12)")" -n 16 \
  --config default --config backend=reference 2>>"$OUT/parity.err" | head -3 | tee "$OUT/parity-ref.txt"
