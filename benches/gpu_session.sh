#!/usr/bin/env bash
# Everything a session with a GPU runs, in one device-tool call:
#
#   benches/gpu_pack.sh               # here: builds and packs .gpu/
#   run(command="bash benches/gpu_session.sh", carry=[".gpu"], timeout_s=600)
#
# 1. every CUDA test suite with the device required (LEANGRAD_REQUIRE_CUDA=1);
# 2. the demo and `leangrad memory --device cuda` next to the meta prediction;
# 3. the CUDA benchmarks (GEMM vs cuBLAS, elementwise vs a device copy, the
#    ResNet-18 conv stack) and the same conv stack in PyTorch on the GPU.
# Logs and JSON lines land in $OUT; commit a summary under benches/results/.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
mkdir -p .gpu/x && tar -C .gpu/x -xJf .gpu/pack.tar.xz
# The tests find fixtures and the leangrad binary at the paths they were built at.
built=$(cat .gpu/x/built-at)
if [ "$built" != "$PWD" ]; then mkdir -p "$(dirname "$built")" && ln -sfn "$PWD" "$built"; fi
mkdir -p target/release && cp .gpu/x/bin/leangrad target/release/leangrad
libs=""
for d in $(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null) \
         /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && libs="$libs:$d"
done
export LD_LIBRARY_PATH="${libs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in /usr/local/cuda/include /usr/local/cuda/targets/x86_64-linux/include; do
    [ -f "$d/cuda_fp16.h" ] && { export LEANGRAD_CUDA_INCLUDE="$d"; break; }
done
export LEANGRAD_REQUIRE_CUDA=1 LEANGRAD_REQUIRE_NVRTC=1 LEANGRAD_KERNEL_CACHE=/tmp/lg-kernel-cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
fail=0
: >"$OUT/tests.log"
for t in .gpu/x/tests/*; do
    start=$SECONDS
    "$t" "$@" >>"$OUT/tests.log" 2>&1 || fail=1
    echo "$(basename "$t") ($((SECONDS - start)) s): $(grep -E '^test result' "$OUT/tests.log" | tail -1)" |
        tee -a "$OUT/summary.txt"
done
grep -E "^test .* FAILED|panicked|skipped" "$OUT/tests.log" | head -40 | tee -a "$OUT/summary.txt"
echo "all test binaries: $([ $fail = 0 ] && echo ok || echo FAILURES)" | tee -a "$OUT/summary.txt"
./target/release/leangrad demo --device cuda >"$OUT/demo.log" 2>&1; tail -3 "$OUT/demo.log"
for args in "--model resnet18 --batch 64 --size 224 --case input-bn-eval" "--model bert_base --batch 8 --case all"; do
    for dev in cuda meta; do
        echo "== memory $args --device $dev" >>"$OUT/memory.log"
        ./target/release/leangrad memory $args --device $dev >>"$OUT/memory.log" 2>&1
    done
done
grep -E "^==|^total" "$OUT/memory.log"
[ "${GPU_BENCH:-1}" = 0 ] && exit $fail
echo "== cuda_gemm"; timeout 200 .gpu/x/benches/cuda_gemm --bench 2>&1 | tee "$OUT/bench-cuda_gemm.jsonl" | tail -5
echo "== conv_stack"; timeout 200 .gpu/x/benches/conv_stack --bench 2>&1 | tee "$OUT/bench-conv_stack.jsonl" | tail -3
echo "== pytorch conv stack"; timeout 150 python3 python-compare/conv_stack_bench.py --device cuda 2>&1 |
    tee "$OUT/pytorch-conv-stack.jsonl" | tail -3
# One training step per workload, measured (the simulated GPU predicts the
# same rows: compare with `gpusim/run cargo bench --bench gpu_step`).
echo "== gpu_step"; timeout 200 .gpu/x/benches/gpu_step --bench --json 2>&1 |
    tee "$OUT/bench-gpu_step.jsonl" | tail -3
echo "== pytorch gpu_step"; timeout 300 python3 python-compare/gpu_step.py --device cuda --json 2>&1 |
    tee "$OUT/pytorch-gpu_step.jsonl" | tail -3
exit $fail
