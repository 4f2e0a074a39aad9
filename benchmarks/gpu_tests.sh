#!/usr/bin/env bash
# The GPU test suite on the GPU machine (carry .carry): every cuda-marked test, then the model-level
# decode tests and the prefill GEMM / plane tests (unmarked: they take the GPU when there is one).
# Each part's whole output goes to $OUT/gpu-tests-<part>.log (so a part stopped by its time limit still
# shows how far it got and what failed); the last lines of each to $OUT/gpu-tests.log. The limits add up
# to 540 s, under one device call's 600. With pytest-xdist there (carry its wheel and execnet's in
# .carry/whl) the cuda part runs over 6 workers on the one GPU: ~130 s where one process takes over 280.
SYNTH=0 source benchmarks/gpu_setup.sh
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 6")
part() {  # part NAME SECONDS PYTEST-ARGS...
  local name=$1 secs=$2; shift 2
  timeout "$secs" python3 -m pytest -q -p no:cacheprovider -rfE --durations=10 "$@" > "$OUT/gpu-tests-$name.log" 2>&1
  echo "== $name (exit $?)" >> "$OUT/gpu-tests.log"
  tail -3 "$OUT/gpu-tests-$name.log" >> "$OUT/gpu-tests.log"
}
part cuda 280 $XDIST -m cuda -k "not test_real"
part model 140 -m "cuda or not cuda" tests/test_decode_neutrality.py tests/test_kernels_e2e.py
part gemm 120 -m "cuda or not cuda" plugins/mmq_triton/tests/test_mmq_gemm.py plugins/mmq_triton/tests/test_mmq_planes.py
cat "$OUT/gpu-tests.log"
