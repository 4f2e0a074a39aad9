#!/usr/bin/env bash
# Twentieth GPU call: tiles and splits of the short decode GEMVs under PDL with their fused prologue
# (sweep_small.py), and tg128 with RMSNorm fused into the float GEMVs against one RMSNorm launch per
# norm (temporary knob MINFER_TMP_FNORM=0), with int8 kept for the norm-fed qkv / gate_up / output.
source benchmarks/gpu_setup.sh
export MINFER_TMP_I8ROLES=qkv,gate_up,output
for m in 7b 05b; do
  for f in 1 0; do
    MINFER_TMP_FNORM=$f timeout 60 minfer bench -m /tmp/$m.gguf -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | sed "s/^/fnorm=$f /" | tee -a "$OUT/bench.md"
  done
done
timeout 400 python3 benchmarks/sweep_small.py 2>&1 | grep -v Warn | tee "$OUT/sweep-small.txt"
