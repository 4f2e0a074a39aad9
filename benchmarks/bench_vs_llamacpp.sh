#!/usr/bin/env bash
# minfer bench beside llama-bench and llama-batched-bench on the same synthesized models, one call,
# one markdown table ($OUT/vs_llamacpp.md). Carry .carry (gguf wheel) and the anchors folder:
#   run: bash benchmarks/bench_vs_llamacpp.sh      carry: [".carry"]  (anchors copied to .carry/anchors)
# P, N, R, BATCHED override the tests (defaults: pp512,pp3314 / tg128 / 3 repetitions / 1,8,32); CONFIGS, a
# space-separated list of minfer configurations (e.g. "default MINFER_MMQ=0"), runs each beside llama.cpp.
source benchmarks/gpu_setup.sh
if wait_llama; then BIN=(--llama-bin "$LLAMA_DIR/b/bin"); else BIN=(); echo "llama.cpp not built: minfer only" >&2; fi
CFG=(); for c in ${CONFIGS:-}; do CFG+=(--config "$c"); done
timeout "${TIMEOUT:-540}" python3 benchmarks/vs_llamacpp.py --models /tmp/7b.gguf /tmp/05b.gguf "${BIN[@]}" "${CFG[@]}" \
  -p "${P:-512,3314}" -n "${N:-128}" -r "${R:-3}" --batched "${BATCHED:-1,8,32}" \
  2> "$OUT/vs_llamacpp.log" | tee "$OUT/vs_llamacpp.md"
