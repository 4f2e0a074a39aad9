#!/usr/bin/env bash
# Sixth GPU call: the GEMV sweep with whole-row steps (BB up to 16, masked), the fixed prefill-graph test.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
timeout 60 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_kernels_e2e.py -k prefill_graph 2>&1 | tail -3 | tee "$OUT/tests.txt"
timeout 330 python3 benchmarks/sweep_gemv.py 2>&1 | tee "$OUT/sweep2.txt"
