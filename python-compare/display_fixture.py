"""Writes the tensor-printing fixtures of tests/tensor_display.rs.

For each case, the tensor goes into tests/fixtures/display/tensors.safetensors
under the case's name, and PyTorch's `repr(tensor)` (default print options:
precision 4, threshold 1000, edgeitems 3, linewidth 80) into
tests/fixtures/display/reprs.txt, as a block

    ### <name> <flags>
    <repr, one or more lines>

where <flags> is `requires_grad` for a leaf that requires grad and `meta`
for a tensor that the test rebuilds on the meta device (its stored copy
gives the shape and dtype). Run from the repository root:

    python3 python-compare/display_fixture.py
"""

import os

import torch
from safetensors.torch import save_file

OUT = os.path.join("tests", "fixtures", "display")


def cases():
    g = torch.Generator().manual_seed(0)
    nan, inf = float("nan"), float("inf")
    t = torch.tensor
    yield "small_2d", t([[0.1, -1.2], [3.0, 4.5]]), ""
    yield "leaf_requires_grad", t([0.1, -1.2, 3.0]), "requires_grad"
    yield "int64", t([[1, -20, 300], [4, 5, 6]]), ""
    yield "uint8", t([0, 7, 255], dtype=torch.uint8), ""
    yield "float64", t([1.5, 2.25, -3.125], dtype=torch.float64), ""
    yield "float16", t([0.1, 1000.5, -2.0], dtype=torch.float16), ""
    yield "bfloat16", t([0.1, 3.0, -7.5], dtype=torch.bfloat16), ""
    yield "integer_floats", t([1.0, 2.0, -3.0, 0.0]), ""
    yield "negative_zero", t([-0.0, 1.0]), ""
    yield "rounding_ties", t([0.125, 0.375, 2.5, 0.00005, 1.0]), ""
    yield "fixed_ties", t([0.03125, 0.15625, 1.0, -0.40625]), ""
    yield "sci_small", t([1e-5, 1.0, -0.5]), ""
    yield "sci_range", t([1.0, 12345.0, 0.5]), ""
    yield "sci_integers", t([1e9, 2.0, -3.0]), ""
    yield "sci_huge", t([1e30, -2.5e-30], dtype=torch.float64), ""
    yield "non_finite", t([nan, inf, -inf, 1.5, 0.0]), ""
    yield "non_finite_integers", t([nan, inf, 2.0]), ""
    yield "all_zero", torch.zeros(3), ""
    yield "scalar", t(3.5), ""
    yield "scalar_int", t(7), ""
    yield "scalar_zero", t(0.0), ""
    yield "empty", torch.zeros(0), ""
    yield "empty_2d", torch.zeros(2, 0), ""
    yield "empty_int64", torch.zeros(0, dtype=torch.int64), ""
    yield "meta", torch.zeros(2, 3), "meta"
    yield "meta_float64", torch.zeros(4, dtype=torch.float64), "meta"
    yield "wrapped_row", torch.randn(30, generator=g), ""
    yield "wrapped_ints", torch.randint(-1000, 1000, (40,), generator=g), ""
    yield "nested_3d", torch.randn(2, 3, 4, generator=g), ""
    yield "summarised_1d", torch.randn(2000, generator=g), ""
    yield "summarised_2d", torch.randn(40, 50, generator=g), ""
    yield "summarised_3d", torch.randint(0, 100000, (10, 10, 12), generator=g), ""
    yield "summarised_sci", torch.randn(1001, generator=g) * 1e6, ""
    yield "long_suffixes", torch.randn(4, 8, generator=g, dtype=torch.float64), "requires_grad"
    yield "wide_suffix_wrap", torch.randn(1, 9, generator=g, dtype=torch.float16), "requires_grad"


def main():
    os.makedirs(OUT, exist_ok=True)
    tensors, blocks = {}, []
    for name, x, flags in cases():
        tensors[name] = x.contiguous()
        shown = x
        if flags == "meta":
            shown = torch.empty(x.shape, dtype=x.dtype, device="meta")
        if flags == "requires_grad":
            shown = x.clone().requires_grad_(True)
        blocks.append(f"### {name} {flags}".rstrip() + "\n" + repr(shown) + "\n")
    save_file(tensors, os.path.join(OUT, "tensors.safetensors"))
    with open(os.path.join(OUT, "reprs.txt"), "w") as f:
        f.write("".join(blocks))


if __name__ == "__main__":
    main()
