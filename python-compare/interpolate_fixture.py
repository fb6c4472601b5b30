"""Writes tests/fixtures/interpolate/bilinear.safetensors for
tests/nn_interpolate.rs: PyTorch's bilinear interpolation
(torch.nn.functional.interpolate(x, size | scale_factor, mode="bilinear",
align_corners)) on the CPU, outputs and input gradients for a random probe
g (y.backward(g)), with align_corners False and True, in f32 and f64 for
every case and in f16/bf16 for a few.

The cases cover upsampling x2 (by scale factor) and to odd sizes,
downsampling, 1x1 -> 7x9 as DeepLabV3's ASPP pooling branch does, scale
factors that are not integers (PyTorch then uses 1/scale_factor as the
scale), an axis whose size does not change, and both of PyTorch's CPU
kernels: the channels-last one (taken when oh + ow <= 128, or for a
channels-last input with C > 3, which a contiguous [N, C, 1, 1] is) with
channels in its vector loop and in its scalar tail, and the generic one
(oh + ow > 128) on contiguous and transposed inputs. PyTorch is run with
two threads (with one it also takes the channels-last kernel for C = 3).

Keys: `<case>.<dtype>.x` (the input's values in NCHW order; the test
builds the case's layout from them) and `<case>.<dtype>.<a0|a1>.<g|y|gx>`. Run from the
repository root:

    python3 python-compare/interpolate_fixture.py
"""

import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join("tests", "fixtures", "interpolate", "bilinear.safetensors")

# name, input shape, size, scale factor, layout, also in f16/bf16.
# Keep in step with CASES in tests/nn_interpolate.rs.
CASES = [
    ("up2", [2, 3, 5, 6], None, (2.0, 2.0), "nchw", True),
    ("odd", [1, 4, 5, 7], (11, 13), None, "nchw", False),
    ("down", [2, 3, 13, 11], (5, 4), None, "nchw", False),
    ("aspp", [2, 5, 1, 1], (7, 9), None, "nchw", True),
    ("aspp_wide", [1, 4, 1, 1], (3, 126), None, "nchw", False),
    ("lanes", [1, 10, 4, 5], (9, 7), None, "nchw", False),
    ("lanes_half", [1, 18, 3, 4], (7, 5), None, "nchw", True),
    ("same", [1, 2, 6, 7], (6, 15), None, "nchw", False),
    ("scale", [1, 3, 7, 9], None, (1.7, 2.3), "nchw", False),
    ("scale_down", [1, 2, 9, 10], None, (0.5, 0.75), "nchw", False),
    ("wide", [1, 2, 9, 8], (4, 125), None, "nchw", True),
    ("wide_c3", [1, 3, 5, 9], (3, 126), None, "nchw", False),
    ("wide_down", [1, 1, 7, 140], (3, 126), None, "nchw", False),
    ("wide_scale", [1, 1, 3, 9], None, (1.7, 13.5), "nchw", False),
    ("wide_transposed", [1, 2, 8, 3], (5, 124), None, "transposed", False),
    ("wide_channels_last", [1, 4, 2, 7], (3, 126), None, "channels_last", False),
]

DTYPES = [
    (torch.float32, "f32"),
    (torch.float64, "f64"),
    (torch.float16, "f16"),
    (torch.bfloat16, "bf16"),
]


def laid_out(x, layout):
    if layout == "transposed":
        return x.transpose(2, 3)
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    return x


def main():
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(11)
    out = {}
    for name, shape, size, factor, layout, halves in CASES:
        base = torch.rand(shape, generator=gen, dtype=torch.float64) * 4 - 2
        for dtype, dname in DTYPES:
            if dname in ("f16", "bf16") and not halves:
                continue
            x = base.to(dtype)
            out[f"{name}.{dname}.x"] = x
            for align in (False, True):
                key = f"{name}.{dname}.a{int(align)}"
                xin = laid_out(x, layout).detach().requires_grad_(True)
                y = F.interpolate(
                    xin, size=size, scale_factor=factor, mode="bilinear", align_corners=align
                )
                g = (torch.rand(y.shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
                y.backward(g)
                out[f"{key}.g"] = g
                out[f"{key}.y"] = y.detach()
                # The input's gradient in the input's (logical) layout, as
                # the test's input: NCHW values, or transposed back.
                gx = xin.grad
                if layout == "transposed":
                    gx = gx.transpose(2, 3)
                out[f"{key}.gx"] = gx
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, OUT)
    print(f"wrote {OUT}: {len(out)} tensors, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
