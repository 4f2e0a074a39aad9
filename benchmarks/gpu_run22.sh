#!/usr/bin/env bash
# Twenty-second GPU call: the q4_K int8 GEMV summing each thread's four words inside the thread (no
# shuffles per step; 110 instead of 122 instructions a step at 8,4,4): tg128 on the 7B and a tile sweep of
# its q4_K shapes (gate_up, down, qkv) with 8-warp and 32-row tiles added.
source benchmarks/gpu_setup.sh
timeout 60 minfer bench -m /tmp/7b.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | tee -a "$OUT/bench.md"
timeout 300 python3 benchmarks/sweep_gemv.py --types Q4_K --roles gate_up,down,qkv --wide 2>&1 | grep -v Warn | tee "$OUT/sweep-q4k.txt"
