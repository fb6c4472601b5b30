"""torchvision's full-size ResNet-101, ResNeXt-101 64x4d, AlexNet,
MobileNetV3-Large, EfficientNetV2-S, -M and -L and ConvNeXt-Tiny and -Base:
their state-dict names, shapes and parameter counts, for
tests/models_resnet.rs, tests/models_alexnet.rs, tests/models_mobilenet_v3.rs,
tests/models_efficientnet.rs and tests/models_convnext.rs, and a check that
export.py's rebuilds of them
(the architectures of the tiny fixtures) are torchvision's own.

Writes tests/fixtures/models/torchvision_models.json: per model the
torchvision constructor, the parameter count, every state-dict entry
(name and shape, in torchvision's order) and, per case of leangrad's
models::Case (the seven selections; `-bn-eval` trains the same), the
number of parameter tensors and values it trains (export.py's
`trainable`, the rule of Case::trainable). Before writing, it builds
export.py's ResNet / AlexNet at torchvision's sizes, checks that their
state dicts have the same names and shapes, loads torchvision's (random)
weights into them and compares the outputs on a 2x3x64x64 (AlexNet:
2x3x96x96) input in f64 in evaluation mode (they must agree within 1e-10
of the largest logit).

Needs torch and torchvision (nothing is downloaded: weights=None). Run
from the repository root:

    python3 python-compare/torchvision_models.py
"""

import json
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402

OUT = os.path.join("tests", "fixtures", "models", "torchvision_models.json")


def rebuilds():
    """name -> (torchvision constructor, export.py's rebuild, input size)."""
    tv = torchvision.models
    return {
        "resnet101": (lambda: tv.resnet101(weights=None),
                      lambda: export.ResNet(export.Bottleneck, [3, 4, 23, 3], 64, 1000, 3),
                      64),
        "resnext101_64x4d": (lambda: tv.resnext101_64x4d(weights=None),
                             lambda: export.ResNet(export.Bottleneck, [3, 4, 23, 3], 64, 1000,
                                                   3, groups=64, width_per_group=4),
                             64),
        "alexnet": (lambda: tv.alexnet(weights=None),
                    lambda: export.AlexNet([64, 192, 384, 256, 256], 3, 6, 4096, 1000, 0.5),
                    96),
        "mobilenet_v3_large": (lambda: tv.mobilenet_v3_large(weights=None),
                               lambda: export.mobilenet_v3(export.LARGE_ROWS, 1280, 1000, 3,
                                                           0.2),
                               64),
        "convnext_tiny": (lambda: tv.convnext_tiny(weights=None),
                          lambda: export.convnext(CONVNEXT_TINY, 1000, 3, 1e-6), 64),
        "convnext_base": (lambda: tv.convnext_base(weights=None),
                          lambda: export.convnext(CONVNEXT_BASE, 1000, 3, 1e-6), 64),
        **{name: (lambda name=name: getattr(tv, name)(weights=None),
                  lambda name=name, p=p: export.efficientnet_v2(export.V2_ROWS[name], 1280, 1000,
                                                                3, p, 0.2),
                  64)
           for name, p in [("efficientnet_v2_s", 0.2), ("efficientnet_v2_m", 0.3),
                           ("efficientnet_v2_l", 0.4)]},
    }


CONVNEXT_TINY = [(96, 192, 3), (192, 384, 3), (384, 768, 9), (768, 0, 3)]
CONVNEXT_BASE = [(128, 256, 3), (256, 512, 3), (512, 1024, 27), (1024, 0, 3)]
"""torchvision's ConvNeXt-Tiny and -Base CNBlockConfig rows (0: no downsampling)."""


def check_rebuild(name, theirs, ours, size):
    """export.py's `ours` has `theirs`' state-dict names and shapes and, with
    its weights, the same outputs."""
    a = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    b = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    if list(a) != list(b) or a != b:
        raise SystemExit(f"{name}: export.py's state dict differs from torchvision's")
    ours.load_state_dict(theirs.state_dict())
    theirs.double().eval()
    ours.double().eval()
    torch.manual_seed(0)
    x = torch.randn(2, 3, size, size, dtype=torch.float64)
    with torch.no_grad():
        y, z = theirs(x), ours(x)
    err = (y - z).abs().max().item() / y.abs().max().item()
    if err > 1e-10:
        raise SystemExit(f"{name}: export.py's output differs from torchvision's by {err:.2e}")
    return err


def main():
    result = {"generator": "python-compare/torchvision_models.py",
              "torch": torch.__version__, "torchvision": torchvision.__version__,
              "models": {}}
    for name, (tv, rebuild, size) in rebuilds().items():
        torch.manual_seed(0)
        theirs = tv()
        count = sum(p.numel() for p in theirs.parameters())
        entries = [[k, list(v.shape)] for k, v in theirs.state_dict().items()]
        err = check_rebuild(name, theirs, rebuild(), size)
        print(f"{name}: {count} parameters, {len(entries)} state-dict entries; "
              f"export.py's rebuild agrees within {err:.1e}", file=sys.stderr)
        params = dict(theirs.named_parameters())
        cases = {}
        for case in export.BASES:
            chosen = export.trainable(case, theirs)
            cases[case] = [len(chosen), sum(params[n].numel() for n in chosen)]
        result["models"][name] = {
            "built": f"torchvision.models.{name}(weights=None)",
            "parameters": count,
            "cases": cases,
            "state_dict": entries,
        }
    lines = ["{"]
    head = {k: v for k, v in result.items() if k != "models"}
    lines += [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(' "models": {')
    models = list(result["models"].items())
    for i, (name, m) in enumerate(models):
        lines.append(f"  {json.dumps(name)}: {{")
        lines.append(f"   \"built\": {json.dumps(m['built'])},")
        lines.append(f"   \"parameters\": {m['parameters']},")
        lines.append(f"   \"cases\": {json.dumps(m['cases'])},")
        lines.append('   "state_dict": [')
        for j, e in enumerate(m["state_dict"]):
            comma = "," if j + 1 < len(m["state_dict"]) else ""
            lines.append(f"    {json.dumps(e)}{comma}")
        lines.append("   ]")
        lines.append("  }" + ("," if i + 1 < len(models) else ""))
    lines += [" }", "}"]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
