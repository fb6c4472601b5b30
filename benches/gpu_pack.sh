#!/usr/bin/env bash
# Packs what a GPU run needs into .gpu/ (ignored by git), built here: the GPU
# machine has no Rust. Only the CUDA-touching test binaries, the CUDA
# benchmarks and the leangrad binary, stripped and xz-compressed (about
# 10 MiB, well inside what travels with the tree). Then, with the tree
# copied there, `bash benches/gpu_session.sh` runs everything.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
suites=(--lib)
for f in tests/device_*.rs tests/cuda_*.rs; do
    [ -e "$f" ] && suites+=(--test "$(basename "$f" .rs)")
done
suites+=(--test kernels_nvrtc --test kernel_signatures --test cli_memory --test cli_demo)
executables() {
    python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
}
rm -rf .gpu && mkdir -p .gpu/stage/tests .gpu/stage/benches .gpu/stage/bin
cargo test --release --no-run --message-format=json "${suites[@]}" 2>/dev/null | executables |
    while read -r exe; do cp "$exe" .gpu/stage/tests/; done
cargo bench --no-run --message-format=json --bench cuda_gemm --bench conv_stack --bench gpu_step 2>/dev/null | executables |
    while read -r exe; do cp "$exe" ".gpu/stage/benches/$(basename "$exe" | sed 's/-[0-9a-f]*$//')"; done
cargo build --release --bins --quiet
cp target/release/leangrad .gpu/stage/bin/
strip .gpu/stage/tests/* .gpu/stage/benches/* .gpu/stage/bin/*
# Paths compiled into the tests (fixtures, the leangrad binary) point here.
pwd >.gpu/stage/built-at
tar -C .gpu/stage -cJf .gpu/pack.tar.xz . && rm -rf .gpu/stage
echo "packed $(du -h .gpu/pack.tar.xz | cut -f1): run(command=\"bash benches/gpu_session.sh\", carry=[\".gpu\"])"
