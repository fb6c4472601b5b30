#!/usr/bin/env bash
# Everything a session with a GPU runs, in one device-tool call (the GPU
# machine has no Rust: build here first).
#
#   ../shared/gpu/prepare.sh          # here: packs .gpu/ (tests, benches, leangrad)
#   run(command="bash benches/gpu_session.sh", carry=[".gpu"], timeout_s=600)
#
# 1. every release test binary (CUDA cases included) via .gpu/run.sh;
# 2. the CUDA benchmarks (GEMM vs cuBLAS, elementwise vs D2D copy; the
#    ResNet-style conv stack) as JSON lines;
# 3. the same conv stack in PyTorch on the same GPU;
# 4. `leangrad memory --device cuda` next to the meta prediction.
# Logs and JSON land in $OUT; commit a summary under benches/results/.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export OUT
bash .gpu/run.sh "$@" 2>&1 | tee "$OUT/tests-summary.txt"
# run.sh set these for its own children only; the benches need them too.
for d in $(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null) \
         /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
for d in /usr/local/cuda/include $(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "include"))' 2>/dev/null); do
  [ -f "$d/cuda_fp16.h" ] && { export CUDA_INCLUDE_DIR="$d"; break; }
done
for b in .gpu/benches/cuda_gemm-* .gpu/benches/conv_stack-*; do
  [ -x "$b" ] || continue
  name=$(basename "$b" | sed 's/-[0-9a-f]*$//')
  echo "== bench $name"
  timeout 240 "$b" --bench 2>&1 | tee "$OUT/bench-$name.jsonl" | tail -20
  if [ "$name" = conv_stack ]; then
    echo "== bench conv_stack with a 256 MiB conv workspace (f32, lean)"
    timeout 120 "$b" --bench --workspace 268435456 --dtypes f32 --policies lean 2>&1 \
      | tee "$OUT/bench-conv_stack-ws256.jsonl" | tail -5
  fi
done
echo "== pytorch conv stack"
timeout 180 python3 python-compare/conv_stack_bench.py --device cuda 2>&1 | tee "$OUT/pytorch-conv-stack.jsonl" | tail -10
echo "== leangrad memory (cuda measured vs meta predicted)"
for dev in meta cuda; do
  .gpu/bin/leangrad memory --model resnet18 --batch 64 --case input-bn-eval --device "$dev" --json \
    > "$OUT/memory-resnet18-$dev.json" 2>&1; echo "$dev: exit $?"
done
