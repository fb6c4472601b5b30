"""PyTorch's time and peak memory for forward+backward of a ResNet-style
conv stack, the reference for leangrad's GPU conv benchmark.

The stack is export.py's ResNet-18 (torchvision's layout and names) at
batch 64, 224x224. For each dtype and case it runs `--warmup` untimed and
`--iters` timed steps of forward, cross-entropy and backward (no optimizer
step) and prints one JSON object (field names shared with leangrad's
`benches/conv_stack.rs`): median and best milliseconds per step and
`torch.cuda.max_memory_allocated` over the timed steps (the number to put
next to leangrad's ledger peak), plus the memory at the start of the step
(parameters and input).

    python3 python-compare/conv_stack_bench.py --device cuda

On CPU (`--device cpu`) only the time is printed. Needs only `torch`.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def resnet18(classes):
    cfg = dict(arch="resnet", block="basic", layers=[2, 2, 2, 2], width=64,
               classes=classes, in_channels=3)
    return export.build(argparse.Namespace(**cfg))


def bench(model, case, dtype, device, batch, size, warmup, iters):
    train = export.trainable(case, model)
    for n, p in model.named_parameters():
        p.requires_grad_(n in train)
    model.train(not case.endswith("-bn-eval"))
    x = torch.randn(batch, 3, size, size, device=device, dtype=dtype)
    x.requires_grad_(case.startswith("input"))
    targets = torch.randint(0, 1000, (batch,), device=device)
    cuda = device.startswith("cuda")

    def step():
        for p in model.parameters():
            p.grad = None
        x.grad = None
        F.cross_entropy(model(x).float(), targets).backward()

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        start_bytes = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    out = {"framework": "pytorch", "torch": torch.__version__, "model": "resnet18",
           "case": case, "dtype": str(dtype).removeprefix("torch."), "batch": batch,
           "size": size, "width": 64, "device": device, "policy": "pytorch",
           "median_ms": statistics.median(times), "best_ms": min(times)}
    if cuda:
        out["gpu"] = torch.cuda.get_device_name()
        out["start_bytes"] = start_bytes
        out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtypes", nargs="+", default=["f32", "bf16"], choices=sorted(DTYPES))
    p.add_argument("--cases", nargs="+", default=["all", "input", "input-bn-eval"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    for name in args.dtypes:
        model = resnet18(1000).to(device=args.device, dtype=DTYPES[name])
        for case in args.cases:
            r = bench(model, case, DTYPES[name], args.device, args.batch, args.size,
                      args.warmup, args.iters)
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
