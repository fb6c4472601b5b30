"""Writes tests/fixtures/activations/hard.safetensors for
tests/nn_activation.rs: PyTorch's hardswish, hardsigmoid and mish, forward and
input gradient (for a given incoming gradient), in f32 and f64, on inputs
that cover every branch: below −3, the boundaries ±3 exactly, inside,
above 3, ±inf and ±0 (NaN is left out: PyTorch's scalar and vectorised CPU
paths disagree on hardswish's NaN gradient). 1000 elements, so the bulk
takes PyTorch's vectorised path. Run from the repository root:

    python3 python-compare/activation_fixture.py
"""

import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join("tests", "fixtures", "activations", "hard.safetensors")

gen = torch.Generator().manual_seed(7)
x = torch.rand(1000, generator=gen, dtype=torch.float64) * 14 - 7
specials = [3.0, -3.0, float("inf"), float("-inf"), 0.0, -0.0, 2.9999999, -2.9999999, 6.0, -6.0]
x[: len(specials)] = torch.tensor(specials, dtype=torch.float64)
g = torch.rand(1000, generator=gen, dtype=torch.float64) * 2 - 1
out = {}
for dtype, name in [(torch.float32, "f32"), (torch.float64, "f64")]:
    xd, gd = x.to(dtype), g.to(dtype)
    out[f"x_{name}"] = xd
    out[f"g_{name}"] = gd
    for op, f in [("hardswish", F.hardswish), ("hardsigmoid", F.hardsigmoid), ("mish", F.mish)]:
        xs = xd.clone().requires_grad_(True)
        y = f(xs)
        y.backward(gd)
        out[f"{op}_{name}"] = y.detach()
        out[f"{op}_grad_{name}"] = xs.grad
save_file({k: v.contiguous() for k, v in out.items()}, OUT)
print(f"wrote {OUT}: {sorted(out)}")
