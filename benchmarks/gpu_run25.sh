#!/usr/bin/env bash
# Twenty-fifth GPU call: the q4_K int8 GEMV with its quant words staged through shared memory by
# Triton's software pipeliner (temporary knob MINFER_TMP_STAGED; tiles of 16+ rows, via the temporary
# MINFER_TMP_Q4CFG for gate|up): tg128 of the 7B for the current code and three staged tiles, then the
# full table (default, MINFER_MMQ=0, graphs off, PDL off, memory) under the fastest of the four, and the
# GPU GEMV tests under it.
source benchmarks/gpu_setup.sh
best=""; bestv=0
for v in "0 8,4,4" "1 16,4,4" "1 16,2,2" "1 16,4,8"; do
  set -- $v
  line=$(MINFER_TMP_STAGED=$1 MINFER_TMP_Q4CFG=$2 timeout 60 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128)
  echo "staged=$1 cfg=$2 $line" | tee -a "$OUT/bench.md"
  t=$(echo "$line" | awk -F'|' '{print $8}' | awk '{print $1}')
  if python3 -c "import sys; sys.exit(0 if float('$t' or 0) > $bestv else 1)"; then best="$1 $2"; bestv=$t; fi
done
set -- $best
echo "fastest: staged=$1 cfg=$2 ($bestv)" | tee -a "$OUT/bench.md"
export MINFER_TMP_STAGED=$1 MINFER_TMP_Q4CFG=$2
CFGS="--config default --config MINFER_MMQ=0 --config plugin=no:cuda_graphs --config MINFER_PDL=0"
timeout 150 minfer bench -m /tmp/7b.gguf -p 512 -n 128 -r 3 --memory $CFGS 2>"$OUT/bench7b.err" | tee "$OUT/bench7b.md"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m cuda plugins/mmq_triton/tests/test_decode_gemv.py tests/test_pdl.py 2>&1 | tail -3 | tee "$OUT/gpu-tests.log"
timeout 60 minfer parity -m /tmp/7b.gguf -p "The quick brown fox" -n 128 2>"$OUT/parity.err" | head -2 | tee "$OUT/parity-allon.txt"
