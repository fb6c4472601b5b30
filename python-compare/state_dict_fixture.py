"""Writes the PyTorch state_dict fixtures of tests/io_safetensors.rs.

For each layer: `<name>.safetensors` holds its state_dict (f32; the Linear
also as `linear_bf16.safetensors`), `<name>_io.safetensors` a reference
`input` and the eval-mode `output` (f32). Run from the repository root:

    python3 python-compare/state_dict_fixture.py
"""

import os

import torch
from safetensors.torch import save_file

OUT = os.path.join("tests", "fixtures", "state_dicts")


def contiguous(sd):
    return {k: v.detach().contiguous().clone() for k, v in sd.items()}


def save(name, module, x):
    module.eval()
    with torch.no_grad():
        y = module(x)
    save_file(contiguous(module.state_dict()), os.path.join(OUT, f"{name}.safetensors"))
    save_file({"input": x.contiguous(), "output": y.contiguous()},
              os.path.join(OUT, f"{name}_io.safetensors"))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)

    linear = torch.nn.Linear(4, 3)
    save("linear", linear, torch.randn(2, 4))
    bf16 = {k: v.to(torch.bfloat16) for k, v in contiguous(linear.state_dict()).items()}
    save_file(bf16, os.path.join(OUT, "linear_bf16.safetensors"))

    conv = torch.nn.Conv2d(2, 3, 3)
    save("conv2d", conv, torch.randn(1, 2, 5, 5))

    # One training step so the running statistics, weight and bias are non-trivial.
    bn = torch.nn.BatchNorm2d(3)
    bn.train()
    opt = torch.optim.SGD(bn.parameters(), lr=0.5)
    xb = torch.randn(2, 3, 4, 4) * 2.0 + 0.5
    bn(xb).pow(2).mean().backward()
    opt.step()
    save("batchnorm2d", bn, torch.randn(2, 3, 4, 4))

    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():
        # PyTorch initialises the biases to zero; make them matter.
        mha.in_proj_bias.uniform_(-0.5, 0.5)
        mha.out_proj.bias.uniform_(-0.5, 0.5)
    mha.eval()
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        y, _ = mha(x, x, x, need_weights=False)
    save_file(contiguous(mha.state_dict()), os.path.join(OUT, "mha.safetensors"))
    save_file({"input": x, "output": y.contiguous()}, os.path.join(OUT, "mha_io.safetensors"))


if __name__ == "__main__":
    main()
