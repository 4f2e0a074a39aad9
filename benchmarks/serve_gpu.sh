#!/usr/bin/env bash
# minfer serve on the GPU machine: the serve tests, then loadgen at concurrency 1/32/128 (128-token
# outputs, ignore_eos) against the synthesized 0.5B and 7B, then a SIGTERM drain. Needs the serve
# extra's wheels and their own requirements among the carried ones (fastapi and what its version
# requires: starlette, pydantic, pydantic-core and jiter for the machine's Python, annotated-doc,
# opentelemetry-api; uvicorn, h11, anyio, openai, httpx, httpcore). Results in $OUT.
# MODELS (default "05b 7b") picks the models; SERVE_TESTS=0 skips the serve tests.
. benchmarks/gpu_setup.sh
[ "${SERVE_TESTS:-1}" = 0 ] || python3 -m pytest -q tests/test_serve_*.py 2>&1 | tail -3 | tee "$OUT/serve_tests.txt"
for m in ${MODELS:-05b 7b}; do
  : > "$OUT/serve_$m.log"  # the server appends, so the lines written here beside it survive
  minfer --backend mmq_triton serve -m /tmp/$m.gguf --parallel 128 --max-queue 512 -c 2048 --port 8080 \
    --shutdown-timeout 10 2>> "$OUT/serve_$m.log" &
  pid=$!
  for _ in $(seq 600); do  # until it answers, or stop here if it exited (its log says why)
    curl -sf http://127.0.0.1:8080/health > /dev/null && break
    kill -0 $pid 2> /dev/null || { tail -3 "$OUT/serve_$m.log"; continue 2; }
    sleep 1
  done
  python3 benchmarks/loadgen.py --url http://127.0.0.1:8080 -c 1,32,128 -n 128 | tee "$OUT/loadgen_$m.md"
  curl -s http://127.0.0.1:8080/metrics > "$OUT/metrics_$m.txt"
  echo "GPU memory in use after the load: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)" >> "$OUT/serve_$m.log"
  kill -TERM $pid; wait $pid; echo "exit status $?" >> "$OUT/serve_$m.log"
done
