"""PyTorch's twin of leangrad's `benches/gpu_step.rs`: one training step per
workload, timed (median of `--iters` after `--warmup`), with the same
workload names, so the two JSON streams line up row by row.

A step is what a training loop does per batch: the batch copied from the
host, forward, cross-entropy, backward, SGD with momentum 0.9 (lr 0.01),
`zero_grad`, and the loss read back with `.item()`.

Workloads: torchvision's ResNet-18 at batch 64, 224², cases `all` (every
parameter trains), `input` (only the input's gradient: every parameter
frozen) and `input-bn-eval` (the same with BatchNorm in evaluation mode),
each in f32 with TF32 off (`torch.backends.cudnn.allow_tf32 = False`,
leangrad's default), f32 with TF32 on (PyTorch's default for convolutions)
and bf16; BERT-base (sequence classification over 1000 classes, as
leangrad's step) and GPT-2 small (next-token loss) at batch 8 × 128, case
`all`, randomly initialised from their configurations (needs
`transformers`). The `_ckpt` rows are the ResNet-18 TF32 `all` step and
the BERT-base step with every residual block / encoder layer a
non-reentrant checkpointed segment (`torch.utils.checkpoint(...,
use_reentrant=False)`; Hugging Face's `gradient_checkpointing_enable`).

    python3 python-compare/gpu_step.py --device cuda --json
    python3 python-compare/gpu_step.py --device cpu --small   # a smoke test

`--small` runs batch 2 at 32² and 2 × 16 tokens, 1 warm-up and 1 timed step.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import torchvision

RESNET_CASES = ["all", "input", "input-bn-eval"]
RESNET_MODES = [("f32", torch.float32, False), ("tf32", torch.float32, True),
                ("bf16", torch.bfloat16, False)]


def workloads():
    """(name, builder) pairs in `benches/gpu_step.rs`'s order."""
    out = [(f"resnet18_b64_{case}_{mode}", ("resnet18", case, dtype, tf32))
           for mode, dtype, tf32 in RESNET_MODES for case in RESNET_CASES]
    out.append(("bert-base_b8x128_all_f32", ("bert_base", "all", torch.float32, False)))
    out.append(("gpt2_b8x128_all_f32", ("gpt2", "all", torch.float32, False)))
    out.append(("resnet18_b64_all_tf32_ckpt", ("resnet18", "all-ckpt", torch.float32, True)))
    out.append(("bert-base_b8x128_all_f32_ckpt", ("bert_base", "all-ckpt", torch.float32, False)))
    return out


def checkpoint_blocks(model):
    """Each residual block's forward a non-reentrant checkpointed segment."""
    from torch.utils.checkpoint import checkpoint

    for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in stage:
            block.forward = lambda x, f=block.forward: checkpoint(f, x, use_reentrant=False)


def resnet_step(case, dtype, device, small):
    batch, size = (2, 32) if small else (64, 224)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=1000).to(device, dtype)
    if case.endswith("-ckpt"):
        case = case.removesuffix("-ckpt")
        checkpoint_blocks(model)
    input_grad = case != "all"
    if input_grad:
        for p in model.parameters():
            p.requires_grad_(False)
    if case.endswith("bn-eval"):
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eval()
    host_x = torch.randn(batch, 3, size, size, dtype=dtype)
    targets = (torch.arange(batch) % 1000).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9) if params else None

    def step():
        x = host_x.to(device).requires_grad_(input_grad)
        loss = F.cross_entropy(model(x).float(), targets)
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
        return loss.item()
    return step


def text_step(name, device, small, ckpt=False):
    import transformers
    batch, seq = (2, 16) if small else (8, 128)
    torch.manual_seed(0)
    if name == "bert_base":
        cfg = transformers.BertConfig(num_labels=1000)
        model = transformers.BertForSequenceClassification(cfg)
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    model = model.to(device)
    model.train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vocab = model.config.vocab_size
    host_ids = (torch.arange(batch * seq) % vocab).view(batch, seq)
    labels = (torch.arange(batch) % 1000).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        ids = host_ids.to(device)
        if name == "bert_base":
            loss = F.cross_entropy(model(input_ids=ids).logits, labels)
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()
    return step


def timed(step, device, warmup, iters):
    for _ in range(warmup):
        step()
    ms = []
    for _ in range(max(iters, 1)):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--workloads", default="", help="names or prefixes, comma-separated")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--small", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--json", action="store_true", help="one JSON object per workload")
    a = p.parse_args(argv)
    if a.small:
        a.warmup, a.iters = 1, 1
    device = torch.device(a.device)
    wanted = [w for w in a.workloads.split(",") if w]
    for name, (model, case, dtype, tf32) in workloads():
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            step = (resnet_step(case, dtype, device, a.small) if model == "resnet18"
                    else text_step(model, device, a.small, case.endswith("-ckpt")))
            row = {"workload": name, "framework": "pytorch", "torch": torch.__version__,
                   "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                   "measured_ms": timed(step, device, a.warmup, a.iters), "small": a.small}
        except Exception as e:  # noqa: BLE001 - one failed workload does not stop the rest
            row = {"workload": name, "framework": "pytorch", "error": str(e)}
        print(json.dumps(row) if a.json else
              f"{name:<34} {row.get('measured_ms', float('nan')):>9.1f} ms  {row.get('error', '')}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
