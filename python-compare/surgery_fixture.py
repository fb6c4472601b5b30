"""Writes the model-surgery fixtures of tests/models_surgery.rs and
tests/nn_sequential.rs into tests/fixtures/surgery/.

The models are export.py's (plain torch.nn with torchvision's names and
initialisation), at the tiny sizes of the model tests, with BatchNorm
statistics and affine parameters randomised as there. Everything is
computed in f64 and stored as f32.

* `<model>_head10.safetensors`: the state dict after replacing the head
  as a user does (`model.fc = nn.Linear(16, 10)`,
  `model.classifier[6] = nn.Linear(8, 10)`,
  `model.classifier[1] = nn.Linear(16, 10)`), `input`, and the eval-mode
  logits `output` (leangrad loads this state dict into its model after
  `replace_head(10, …)`).
* `<model>_features.safetensors`: a state dict (`state.<name>`), `input`,
  the eval-mode outputs of the layers in `NAMES[model]` (`feature.<name>`,
  taken with forward hooks that clone, so an in-place ReLU after the layer
  does not overwrite them; flatten is torch.flatten of avgpool's output),
  `probe.<name>` and `grad.input`, the gradient of
  sum over names of sum(feature * probe) with respect to the input.
  vgg19_tiny has torchvision's VGG-19 plan ("E") at tiny widths and its
  style-transfer layers (relu1_1 … relu5_1, relu4_2), and also `output`.
* `sequential.safetensors`: nn.Sequential(Linear(4, 8), ReLU(),
  Linear(8, 3)): `state.*`, `input`, `output`, `grad.input` and
  `grad.<param>` of sum(output * probe).

Run from the repository root:

    python3 python-compare/surgery_fixture.py
"""

import os
import sys
from argparse import Namespace

import torch
from torch import nn
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
import export  # noqa: E402  (the architectures)

OUT = os.path.join("tests", "fixtures", "surgery")

VGG16_TINY = [1, 1, 0, 2, 2, 0, 2, 2, 2, 0, 4, 4, 4, 0, 4, 4, 4, 0]
VGG19_TINY = [2, 2, 0, 4, 4, 0, 4, 4, 4, 4, 0, 8, 8, 8, 8, 0, 8, 8, 8, 8, 0]

MODELS = {
    "resnet18_tiny": dict(arch="resnet", block="basic", layers=[2, 2, 2, 2], width=2,
                          classes=5, in_channels=1),
    "vgg16_tiny": dict(arch="vgg", plan=VGG16_TINY, bn=False, in_channels=1, pool_size=1,
                       hidden=8, classes=5, dropout=0.0),
    "vgg16_bn_tiny": dict(arch="vgg", plan=VGG16_TINY, bn=True, in_channels=1, pool_size=1,
                          hidden=8, classes=5, dropout=0.0),
    "vgg19_tiny": dict(arch="vgg", plan=VGG19_TINY, bn=False, in_channels=3, pool_size=1,
                       hidden=8, classes=5, dropout=0.0),
    "mobilenet_v2_tiny": dict(arch="mobilenet_v2", width=4,
                              settings=[1, 2, 1, 1, 6, 3, 2, 2, 6, 4, 2, 2], last_channel=16,
                              classes=5, in_channels=1, dropout=0.0),
}

NAMES = {
    "resnet18_tiny": ["bn1", "relu", "maxpool", "layer1.1", "layer2", "layer4", "avgpool",
                      "flatten"],
    "vgg16_tiny": ["features.3", "features.8", "features.15", "features.22"],
    "vgg16_bn_tiny": ["features.1", "features.5", "features.12"],
    "vgg19_tiny": ["features.1", "features.6", "features.11", "features.20", "features.22",
                   "features.29"],
    "mobilenet_v2_tiny": ["features.0", "features.2", "features.4"],
}


def model_of(name, seed):
    torch.manual_seed(seed)
    args = Namespace(**{"block": "basic", "layers": [2, 2, 2, 2], **MODELS[name]})
    model = export.build(args)
    export.randomise_bn(model, (2, args.in_channels, 32, 32), seed)
    return model, args


def state_of(model):
    """The state dict with float tensors as f32 (num_batches_tracked stays
    int64)."""
    return {k: (v.float() if v.is_floating_point() else v).detach().contiguous().clone()
            for k, v in model.state_dict().items()}


def module_named(model, name):
    return dict(model.named_modules())[name]


def f32(t):
    return t.detach().float().contiguous()


def head_fixture(name, head_path, in_features):
    model, args = model_of(name, 3)
    parent, index = head_path
    new_head = nn.Linear(in_features, 10)
    if index is None:
        setattr(model, parent, new_head)
    else:
        getattr(model, parent)[index] = new_head
    x = torch.randn(2, args.in_channels, 32, 32)
    state = state_of(model)
    model.double().eval()
    with torch.no_grad():
        y = model(x.double())
    save_file({**state, "input": x, "output": f32(y)},
              os.path.join(OUT, f"{name}_head10.safetensors"))


def features_fixture(name, seed):
    model, args = model_of(name, seed)
    state = state_of(model)
    x = torch.randn(2, args.in_channels, 32, 32)
    model.double().eval()
    taps = {}
    flatten = "flatten" in NAMES[name]
    for n in NAMES[name]:
        if n == "flatten":
            continue
        def hook(_m, _i, out, n=n):
            taps[n] = out.clone()  # before an in-place ReLU overwrites it
        module_named(model, n).register_forward_hook(hook)
    xx = x.double().requires_grad_(True)
    y = model(xx)
    if flatten:
        taps["flatten"] = torch.flatten(taps["avgpool"], 1)
    gen = torch.Generator().manual_seed(seed + 100)
    probes = {n: torch.randn(taps[n].shape, generator=gen, dtype=torch.float64)
              for n in NAMES[name]}
    loss = sum((taps[n] * probes[n]).sum() for n in NAMES[name])
    loss.backward()
    out = {f"state.{k}": v for k, v in state.items()}
    out["input"] = x
    out["grad.input"] = f32(xx.grad)
    out["output"] = f32(y)
    for n in NAMES[name]:
        out[f"feature.{n}"] = f32(taps[n])
        out[f"probe.{n}"] = f32(probes[n])
    save_file(out, os.path.join(OUT, f"{name}_features.safetensors"))


def sequential_fixture():
    torch.manual_seed(5)
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    state = state_of(seq)
    x = torch.randn(5, 4)
    probe = torch.randn(5, 3)
    seq.double()
    xx = x.double().requires_grad_(True)
    y = seq(xx)
    (y * probe.double()).sum().backward()
    out = {f"state.{k}": v for k, v in state.items()}
    out.update({"input": x, "probe": probe, "output": f32(y), "grad.input": f32(xx.grad)})
    out.update({f"grad.{n}": f32(p.grad) for n, p in seq.named_parameters()})
    save_file(out, os.path.join(OUT, "sequential.safetensors"))


def main():
    os.makedirs(OUT, exist_ok=True)
    head_fixture("resnet18_tiny", ("fc", None), 16)
    head_fixture("vgg16_tiny", ("classifier", 6), 8)
    head_fixture("mobilenet_v2_tiny", ("classifier", 1), 16)
    for seed, name in enumerate(NAMES):
        features_fixture(name, seed)
    sequential_fixture()


if __name__ == "__main__":
    main()
