#!/usr/bin/env bash
# Twenty-ninth GPU call: the MMA GEMV with register lookahead and L2 prefetch (sweep_ring.py), after
# its GPU tests. (Run 28 showed the loads of a lookahead sunk below the MMAs by ptxas.)
# (Record of the run at its commit: test_decode_ring.py and sweep_ring.py were since renamed test_decode_mma.py
# and sweep_mma.py, and the ring kernel and the prefetch option removed.)
SYNTH=0 source benchmarks/gpu_setup.sh
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider -m cuda plugins/mmq_triton/tests/test_decode_ring.py 2>&1 | tail -25 | tee "$OUT/ring-tests.log"
timeout 300 python3 benchmarks/sweep_ring.py 2>&1 | tee "$OUT/sweep-ring.txt"
