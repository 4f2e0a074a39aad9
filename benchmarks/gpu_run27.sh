#!/usr/bin/env bash
# Twenty-seventh GPU call (run twice: 27 ring only, 28 with the MMA kernel): the Gluon GEMVs
# (gemv_q4ring, gemv_q4mma) against gguf's dequantizer, then timed against the Triton q4_K int8 GEMV at the 7B's shapes.
# (Record of the run at its commit: test_decode_ring.py and sweep_ring.py were since renamed test_decode_mma.py
# and sweep_mma.py, and the ring kernel and the prefetch option removed.)
SYNTH=0 source benchmarks/gpu_setup.sh
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider -m cuda plugins/mmq_triton/tests/test_decode_ring.py 2>&1 | tail -25 | tee "$OUT/ring-tests.log"
timeout 300 python3 benchmarks/sweep_ring.py 2>&1 | tee "$OUT/sweep-ring.txt"
