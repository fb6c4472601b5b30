"""What PyTorch keeps for backward in one training step, per case.

Builds the same architectures as export.py (plain torch.nn with
torchvision's names) at full size on PyTorch's meta device (shapes only, no
arithmetic), applies a selective-differentiation case (the same selection
rule as export.py and leangrad's `models::Case`), and runs forward plus the
cross-entropy loss under `torch.autograd.graph.saved_tensors_hooks`,
counting the bytes of every distinct storage autograd saves that is not a
parameter or buffer of the model. That is the number to put next to
`leangrad memory`'s "saved" peak (lean and save-all):

    python3 python-compare/pytorch_saved_bytes.py --model resnet18 --batch 64
    cargo run --release -- memory --model resnet18 --batch 64 --case input --json

Prints one JSON object per case. Needs only `torch`.
tests/fixtures/pytorch_saved_bytes.json holds its output for resnet18 and
resnet50 at batch 16, every case (`--batch 16 --cases <the 14 names>`),
which tests/pytorch_saved_bytes.rs compares with leangrad's save-all and
lean policies on leangrad's meta device.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402  (the architectures and the case rule)

CONFIGS = {
    "resnet18": dict(arch="resnet", block="basic", layers=[2, 2, 2, 2], width=64),
    "resnet50": dict(arch="resnet", block="bottleneck", layers=[3, 4, 6, 3], width=64),
}
DEFAULT_CASES = ["all", "input", "input-bn-eval", "norm", "surgical-last"]


def build(name, classes):
    cfg = dict(CONFIGS[name], classes=classes, in_channels=3)
    return export.build(argparse.Namespace(**cfg))


def storage_key(t):
    return StorageWeakRef(t.untyped_storage()).cdata


def saved_bytes(model, case, batch, size, classes):
    """Bytes of the distinct non-parameter storages autograd saves during
    forward and loss of one step in `case`."""
    train = export.trainable(case, model)
    for n, p in model.named_parameters():
        p.requires_grad_(n in train)
    model.train(not case.endswith("-bn-eval"))
    owned = {storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
    seen = {}

    def pack(t):
        key = storage_key(t)
        if key not in owned:
            seen[key] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(batch, 3, size, size, device="meta")
    x.requires_grad_(case.startswith("input"))
    targets = torch.zeros(batch, dtype=torch.long, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), targets)
    del loss
    return sum(seen.values())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(CONFIGS), default="resnet18")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES)
    args = p.parse_args()
    with torch.device("meta"):
        model = build(args.model, args.classes)
    for case in args.cases:
        b = saved_bytes(model, case, args.batch, args.size, args.classes)
        print(json.dumps({"model": args.model, "batch": args.batch, "size": args.size,
                          "case": case, "pytorch_saved_bytes": b}))


if __name__ == "__main__":
    main()
