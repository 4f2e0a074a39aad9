set -o pipefail; export PYTHONUNBUFFERED=1
(bash .carry/anchors/build_llamacpp.sh /tmp/llamacpp &) 
source benchmarks/gpu_setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv | tee $OUT/gpu.txt
timeout 240 python3 benchmarks/decode_depth.py /tmp/7b.gguf --depths 0,4096 2>&1 | grep -v Warn | tee $OUT/depth7b.md
timeout 60 python3 benchmarks/step_timeline.py /tmp/7b.gguf --depth 4096 --top 20 2>&1 | tail -22 | tee $OUT/timeline_d4096.txt
for i in $(seq 1 60); do grep -q BUILD_RC /tmp/llamacpp/build.log 2>/dev/null && break; sleep 5; done; tail -2 /tmp/llamacpp/build.log
timeout 120 /tmp/llamacpp/b/bin/llama-bench -m /tmp/7b.gguf -p 0 -n 128 -d 0,4096 -fa 1 -r 3 2>&1 | tee $OUT/llama7b.md
