#!/usr/bin/env bash
# Twenty-ninth GPU call: the MMA GEMV with register lookahead and L2 prefetch (sweep_ring.py), after
# its GPU tests. (Run 28 showed the loads of a lookahead sunk below the MMAs by ptxas.)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/mmq_triton -e plugins/f16_wmma -e plugins/cuda_graphs 2>&1 | grep -v -i warn
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider -m cuda plugins/mmq_triton/tests/test_decode_ring.py 2>&1 | tail -25 | tee "$OUT/ring-tests.log"
timeout 300 python3 benchmarks/sweep_ring.py 2>&1 | tee "$OUT/sweep-ring.txt"
