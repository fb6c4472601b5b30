"""PyTorch's side of leangrad's CPU speed comparison (benches/vs_pytorch.rs).

Started by the bench, not by hand: it reads one JSON request per line on
stdin and answers one JSON line on stdout.

    {"cmd": "setup", "workload": NAME}  builds the workload's tensors/model
    {"cmd": "time", "reps": R}          runs R iterations: {"ms": mean}
    {"cmd": "teardown"}                 drops the workload
    {"cmd": "quit"}

The first line it writes is {"torch": VERSION} (or {"error": ...} when
torch cannot be imported). Each workload mirrors the bench's leangrad side:
same shapes, f32, same thread count (`--threads`, torch.set_num_threads),
and each iteration times itself (work done only to prepare a
backward-only measurement, the forward, is outside the clock).
"""

import argparse
import json
import math
import os
import sys
import time


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


try:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint
except Exception as e:  # noqa: BLE001 - any import failure means "no torch"
    reply({"error": f"cannot import torch: {e}"})
    sys.exit(0)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402  (the torchvision-layout ResNet)


def timed(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1e3


class BertLayer(nn.Module):
    """Hugging Face's BertLayer (post-norm, exact GELU, SDPA attention,
    no dropout)."""

    def __init__(self, d, heads, inner, eps):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.dense, self.norm1 = nn.Linear(d, d), nn.LayerNorm(d, eps=eps)
        self.intermediate, self.output = nn.Linear(d, inner), nn.Linear(inner, d)
        self.norm2 = nn.LayerNorm(d, eps=eps)

    def forward(self, x):
        b, n, d = x.shape

        def split(t):
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)),
                                             split(self.value(x)))
        a = self.norm1(self.dense(ctx.transpose(1, 2).reshape(b, n, d)) + x)
        return self.norm2(self.output(F.gelu(self.intermediate(a))) + a)


class BertClassifier(nn.Module):
    """BERT-base (`BertForSequenceClassification` without dropout): the
    embeddings, 12 layers, tanh pooler, Linear classifier."""

    def __init__(self, classes, vocab=30522, d=768, layers=12, heads=12, inner=3072,
                 positions=512, types=2, eps=1e-12):
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.position = nn.Embedding(positions, d)
        self.token_type = nn.Embedding(types, d)
        self.norm = nn.LayerNorm(d, eps=eps)
        self.layers = nn.ModuleList(BertLayer(d, heads, inner, eps) for _ in range(layers))
        self.pooler = nn.Linear(d, d)
        self.classifier = nn.Linear(d, classes)
        self.checkpointing = False

    def forward(self, x):
        h = self.word(x) if x.dtype == torch.int64 else x
        n = h.shape[1]
        h = self.norm(h + self.token_type.weight[0] + self.position.weight[:n])
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=False) if self.checkpointing else layer(h)
        return self.classifier(torch.tanh(self.pooler(h[:, 0])))


def conv(cin, cout, hw, k, stride, part):
    x = torch.randn(8, cin, hw, hw, requires_grad=part == "dx")
    w = (torch.randn(cout, cin, k, k) * 0.05).requires_grad_(part == "dw")
    ohw = (hw + 2 * (k // 2) - k) // stride + 1
    g = torch.randn(8, cout, ohw, ohw)
    if part == "fwd":
        def it():
            with torch.no_grad():
                return timed(lambda: F.conv2d(x, w, stride=stride, padding=k // 2))
        return it

    def it():
        y = F.conv2d(x, w, stride=stride, padding=k // 2)
        ms = timed(lambda: y.backward(g))
        x.grad = None
        w.grad = None
        return ms
    return it


def optimizer(make):
    ws = [torch.randn(1000, 1000, requires_grad=True) for _ in range(10)]
    x = torch.randn(16, 1000)
    sum((x @ w.t()).sum() for w in ws).backward()
    opt = make(ws)
    return lambda: timed(opt.step)


def trainable(model, case):
    """The parameters `case` trains, by leangrad's rule: all, none (input,
    input-bn-eval), or the last quarter of the modules that own parameters
    (surgical-last)."""
    base = case.removesuffix("-bn-eval")
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    if base == "all":
        return list(model.parameters())
    if base == "input":
        return []
    if base == "surgical-last":
        last = owners[len(owners) - math.ceil(len(owners) / 4):]
        return [p for m in last for p in m.parameters(recurse=False)]
    raise ValueError(f"case {case} is not measured here")


class Segment(nn.Module):
    """A residual block run as a non-reentrant checkpointed segment."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)


def model_step(name, case, size=112, ckpt=False):
    """ResNet-18 at `size`² (batch 8 at 112², 4 at 224², SGD momentum) or
    BERT-base at 2 × 128 tokens (Adam); with `ckpt` every residual block or
    encoder layer a checkpointed segment (`torch.utils.checkpoint`,
    non-reentrant)."""
    classes, adam = (1000, False) if name == "resnet18" else (2, True)
    if name == "resnet18":
        cfg = dict(arch="resnet", block="basic", layers=[2, 2, 2, 2], width=64,
                   classes=classes, in_channels=3)
        model = export.build(argparse.Namespace(**cfg))
        batch = 4 if size == 224 else 8
        x = torch.randn(batch, 3, size, size)
        targets = torch.arange(batch) % classes
    else:
        model = BertClassifier(classes)
        if case == "input":
            x = torch.randn(2, 128, 768)
        else:
            x = torch.arange(256).reshape(2, 128) % 30522
        targets = torch.arange(2) % classes
    params = trainable(model, case)
    if ckpt and name == "resnet18":
        for s in range(1, 5):
            stage = getattr(model, f"layer{s}")
            for i in range(len(stage)):
                stage[i] = Segment(stage[i])
    elif ckpt:
        model.checkpointing = True
    chosen = {id(p) for p in params}
    for p in model.parameters():
        p.requires_grad_(id(p) in chosen)
    model.train(not case.endswith("-bn-eval"))
    if case.startswith("input"):
        x.requires_grad_(True)
    opt = None
    if params:
        opt = (torch.optim.Adam(params, lr=1e-4) if adam
               else torch.optim.SGD(params, lr=0.01, momentum=0.9))

    def step():
        F.cross_entropy(model(x), targets).backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        x.grad = None

    return lambda: timed(step)


def setup(name):
    if name == "matmul_1024":
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
        return lambda: timed(lambda: a @ b)
    if name == "add_1e7":
        a, b = torch.randn(10_000_000), torch.randn(10_000_000)
        return lambda: timed(lambda: a + b)
    if name == "gelu_1e7":
        x = torch.randn(10_000_000, requires_grad=True)
        g = torch.randn(10_000_000)

        def it():
            ms = timed(lambda: F.gelu(x).backward(g))
            x.grad = None
            return ms
        return it
    convs = {"conv_c1": (3, 64, 112, 7, 2), "conv_l1": (64, 64, 28, 3, 1),
             "conv_l2": (128, 128, 14, 3, 1), "conv_l3": (256, 256, 7, 3, 1),
             "conv_l4": (512, 512, 4, 3, 1)}
    if name[:7] in convs:
        return conv(*convs[name[:7]], name[8:])
    if name == "sgd_10m":
        return optimizer(lambda ws: torch.optim.SGD(ws, lr=0.01, momentum=0.9))
    if name == "adam_10m":
        return optimizer(lambda ws: torch.optim.Adam(ws, lr=1e-3))
    if name == "adam8bit_10m":
        import bitsandbytes as bnb  # its 8-bit optimizers run on the CPU too

        return optimizer(lambda ws: bnb.optim.Adam8bit(ws, lr=1e-3))
    ckpt = name.endswith("_ckpt")
    base = name.removesuffix("_ckpt")
    for prefix, model, size in (("resnet18_224_", "resnet18", 224),
                                ("resnet18_", "resnet18", 112), ("bert_", "bert", 0)):
        if base.startswith(prefix):
            return model_step(model, base[len(prefix):].replace("_", "-"), size, ckpt)
    raise ValueError(f"unknown workload {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    reply({"torch": torch.__version__, "threads": torch.get_num_threads()})
    iteration = None
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["cmd"] == "setup":
                iteration = setup(req["workload"])
                reply({"ok": True})
            elif req["cmd"] == "time":
                reps = req.get("reps", 1)
                reply({"ms": math.fsum(iteration() for _ in range(reps)) / reps})
            elif req["cmd"] == "teardown":
                iteration = None
                reply({"ok": True})
            elif req["cmd"] == "quit":
                return
        except Exception as e:  # noqa: BLE001 - reported to the bench
            reply({"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
