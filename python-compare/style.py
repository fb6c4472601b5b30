"""`leangrad style` in PyTorch: the same command-line options (names,
defaults, meanings), the same job and the same `--json` report, for side
by side runs (benches/jobs_side_by_side.py).

Neural style transfer as PyTorch's tutorial and leangrad's jobs::style
compute it: torchvision's VGG-19 (or VGG-16) `features` only (the
classifier is never built: leangrad keeps it out too), every parameter
frozen, evaluation mode; torchvision's init with `torch.manual_seed(seed)`
unless `--weights W.safetensors` (torchvision's VGG state_dict, whole or
`features.*` only; `classifier.*` is skipped, every feature must match).
Losses on the convolution outputs (style conv1_1 … conv5_1 = VGG-19
`features.0, 5, 10, 19, 28`, content conv4_2 = `features.21`; VGG-16
`0, 5, 10, 17, 24` and `19`), Gram matrices F·Fᵀ/(C·H·W), mean-squared
errors weighted by `--content-weight` and `--style-weight`, the ImageNet
normalisation inside (`--input-convention caffe`: BGR, 0-255, Caffe's
mean subtracted, for Caffe's weights); the forward pass stops at the last layer read. The
ReLUs right after a layer that is read run out of place (an in-place ReLU
would overwrite the conv output the loss reads, as the tutorial notes);
the others stay torchvision's in-place ReLUs. Images as leangrad's
`read_resized`: PIL decode to RGB in [0, 1], the shorter side resized to
`--size` (antialiased bilinear, aspect kept, no crop). `--optimizer adam`:
evaluate, step, clamp the image to [0, 1]; `lbfgs`: `torch.optim.LBFGS(lr,
max_iter=1)` with the tutorial's closure (clamp, loss, backward), one
iteration per step. A loss that is not finite, one above 10x the first
step's for 10 steps in a row, or a result's loss above 10x the first
step's stops the run with an error (`--keep-going`: a warning on stderr,
and `diverged` in the report). `--every N` writes `OUT-000050.png` … beside `--out`.

Report fields: those of leangrad's `StyleReport` with the same meanings.
What differs: without `--weights` (and with `--init noise`) the random
numbers come from torch's generator, not leangrad's Philox stream; and the
`memory` object, explained in jobs_common.py (`lean_step_bytes` is always
null; on the CPU `measured_peak_bytes` is null and `peak_rss_bytes` stands
beside it; the step measured is the first loss-and-gradient evaluation).
Threads: RAYON_NUM_THREADS.

    RAYON_NUM_THREADS=2 python python-compare/style.py --content c.png --style s.png --out o.png --json
"""

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobs_common as jc  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision.transforms.functional as TF  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torchvision.models.vgg import cfgs, make_layers  # noqa: E402

# Caffe's VGG weights: BGR, 0-255, these means (B, G, R) subtracted.
CAFFE_MEAN_BGR = [103.939, 116.779, 123.68]
# How far above the first step's loss the loss may stay, and for how many
# steps (leangrad's jobs::style::DIVERGENCE_FACTOR and DIVERGENCE_STEPS).
DIVERGENCE_FACTOR = 10.0
DIVERGENCE_STEPS = 10
# The optimizers' names in reports.
OPTIMIZER_NAMES = {"adam": "Adam", "lbfgs": "L-BFGS"}

# name: (torchvision plan, style layers, content layers)
NETS = {
    "vgg19": ("E", [0, 5, 10, 19, 28], [21]),
    "vgg16": ("D", [0, 5, 10, 17, 24], [19]),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="style.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--content", required=True, help="the content image")
    p.add_argument("--style", required=True, help="the style image")
    p.add_argument("--weights", default=None, help="torchvision's VGG state_dict (or its features.*)")
    p.add_argument("--model", default="vgg19", choices=["vgg19", "vgg16"])
    p.add_argument("--size", type=int, default=256, help="shorter side of both images")
    p.add_argument("--steps", type=int, default=300, help="loss-and-gradient evaluations")
    p.add_argument("--content-weight", type=float, default=1.0, help="weight of the content loss")
    p.add_argument("--style-weight", type=float, default=1e6, help="weight of the style loss")
    p.add_argument("--optimizer", default="lbfgs", choices=["lbfgs", "adam"])
    p.add_argument("--lr", type=float, default=None, help="default: 1 for lbfgs, 0.02 for adam")
    p.add_argument("--init", default="content", choices=["content", "noise"])
    p.add_argument("--seed", type=int, default=0, help="seed of the noise start and the random VGG")
    p.add_argument("--out", required=True, help="the result (PNG)")
    p.add_argument("--every", type=int, default=None, help="also write OUT-000100.png etc. every N steps")
    p.add_argument("--input-convention", default="torchvision", choices=["torchvision", "caffe"],
                   help="the VGG's input: torchvision's normalisation, or Caffe's BGR 0-255 minus mean")
    p.add_argument("--keep-going", action="store_true",
                   help="run on when the loss diverges (with a warning) instead of stopping")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", action="store_true", help="write only JSON to stdout")
    return p.parse_args(argv)


class Features(nn.Module):
    """Holds torchvision's `features` under its state-dict names."""

    def __init__(self, plan):
        super().__init__()
        self.features = make_layers(cfgs[plan], batch_norm=False)
        for m in self.modules():  # torchvision's VGG init
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.constant_(m.bias, 0)


def build_vgg(a, device):
    plan, style_layers, content_layers = NETS[a.model]
    torch.manual_seed(a.seed)
    vgg = Features(plan)
    if a.weights is not None:
        if not os.path.isfile(a.weights):
            raise jc.JobError(f"weights file `{a.weights}` not found")
        tensors = {k: v for k, v in load_file(a.weights).items() if not k.startswith("classifier.")}
        vgg.load_state_dict(tensors, strict=True)
    read = set(style_layers + content_layers)
    for i, layer in enumerate(vgg.features):
        if isinstance(layer, nn.ReLU) and i - 1 in read:
            layer.inplace = False
    return vgg.to(device).eval().requires_grad_(False)


def check(a):
    if a.size < 1 or a.steps < 1:
        raise jc.JobError("size and steps must be at least 1")
    if a.every is not None and a.every < 1:
        raise jc.JobError("every must be at least 1")
    for what, w in (("content weight", a.content_weight), ("style weight", a.style_weight)):
        if not (w >= 0 and w != float("inf")):
            raise jc.JobError(f"{what} must be a number ≥ 0, not {w}")
    if a.lr is not None and not (a.lr > 0 and a.lr != float("inf")):
        raise jc.JobError(f"lr must be a positive number, not {a.lr}")


def read_resized(path, size):
    """As leangrad's jobs::style::read_resized: `[1, 3, H, W]` in [0, 1]."""
    return TF.resize(jc.read_image(path), size, antialias=True).unsqueeze(0)


def gram(f):
    n, c, h, w = f.shape
    m = f.reshape(n * c, h * w)
    return m @ m.t() / (n * c * h * w)


def network_input(x, convention):
    """The VGG's input for images `x` in [0, 1] (leangrad's InputConvention)."""
    if convention == "caffe":
        mean = torch.tensor(CAFFE_MEAN_BGR, device=x.device).view(1, 3, 1, 1)
        return x[:, [2, 1, 0]] * 255.0 - mean
    return jc.normalize(x)


def divergence(history):
    """What says the losses so far diverged (leangrad's jobs::style::divergence)."""
    first, last, step = history[0], history[-1], len(history)
    if not math.isfinite(last):
        return f"the loss became {last} at step {step}"
    recent = history[1:][-DIVERGENCE_STEPS:]
    if len(recent) == DIVERGENCE_STEPS and all(x > DIVERGENCE_FACTOR * first for x in recent):
        return (f"the loss rose from {first:.4e} at step 1 to above {DIVERGENCE_FACTOR}× that for "
                f"{DIVERGENCE_STEPS} steps, {last:.4e} ({last / first:.0f}×) at step {step}: "
                "the image is turning into noise")
    return None


def divergence_at_end(history, last):
    """What says the result diverged (leangrad's jobs::style::divergence_at_end)."""
    first = history[0]
    if not math.isfinite(last):
        return f"the result's loss is {last}"
    if last > DIVERGENCE_FACTOR * first:
        return (f"the loss rose from {first:.4e} at step 1 to {last:.4e} for the result, "
                f"{last / first:.0f}× (more than {DIVERGENCE_FACTOR}×): the image is noise")
    return None


def layer_maps(vgg, x, layers, convention):
    """The outputs of `layers` (features indices), running only up to the last."""
    out, h = {}, network_input(x, convention)
    for i, layer in enumerate(vgg.features):
        h = layer(h)
        if i in layers:
            out[i] = h
        if i >= max(layers):
            break
    return out


class Transfer:
    """The frozen VGG, the targets computed once, and the image (the only leaf
    that requires grad): leangrad's jobs::style::Transfer."""

    def __init__(self, vgg, a, content, style, init):
        _, self.style_layers, self.content_layers = NETS[a.model]
        self.vgg, self.cw, self.sw = vgg, a.content_weight, a.style_weight
        self.convention = a.input_convention
        with torch.no_grad():
            c = layer_maps(vgg, content, self.content_layers, self.convention)
            s = layer_maps(vgg, style, self.style_layers, self.convention)
            self.content_targets = [c[i] for i in self.content_layers]
            self.style_targets = [gram(s[i]) for i in self.style_layers]
        self.image = init.detach().clone().requires_grad_(True)

    def loss_tensors(self):
        maps = layer_maps(self.vgg, self.image, self.style_layers + self.content_layers,
                          self.convention)
        content = sum(F.mse_loss(maps[i], t) for i, t in zip(self.content_layers, self.content_targets))
        style = sum(F.mse_loss(gram(maps[i]), t) for i, t in zip(self.style_layers, self.style_targets))
        return content * self.cw, style * self.sw

    def evaluate(self):
        """Forward and backward; the image's new gradient in its `.grad`."""
        self.image.grad = None
        content, style = self.loss_tensors()
        (content + style).backward()
        return losses(content.item(), style.item())

    def losses(self):
        with torch.no_grad():
            content, style = self.loss_tensors()
        return losses(content.item(), style.item())

    def clamp_image(self):
        with torch.no_grad():
            self.image.clamp_(0, 1)

    def targets(self):
        return self.content_targets + self.style_targets


def losses(content, style):
    return {"content": content, "style": style, "total": content + style}


def frame_path(out, step):
    stem, _ = os.path.splitext(os.path.basename(out))
    return os.path.join(os.path.dirname(out), f"{stem}-{step:06d}.png")


def run(a):
    check(a)
    device = jc.choose_device(a.device)
    content = read_resized(a.content, a.size)
    style = read_resized(a.style, a.size)
    frames_written = range(a.every, a.steps + 1, a.every) if a.every else []
    jc.check_png_outputs([a.out] + [frame_path(a.out, s) for s in frames_written], "--out")
    if os.path.dirname(a.out):
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
    start = time.perf_counter()
    vgg = build_vgg(a, device)
    content, style = content.to(device), style.to(device)
    if a.init == "noise":
        gen = torch.Generator(device=device).manual_seed(a.seed)
        init = torch.rand(content.shape, generator=gen, device=device)
    else:
        init = content
    transfer = Transfer(vgg, a, content, style, init)
    del content, style, init
    meter = jc.StepMemory(device)

    def evaluate():
        if meter.step_bytes is not None:
            return transfer.evaluate()
        with meter.measure(vgg, transfer.targets() + [transfer.image]):
            return transfer.evaluate()

    lr = a.lr if a.lr is not None else (1.0 if a.optimizer == "lbfgs" else 0.02)
    history, frames, diverged = [], [], []

    def diverge(what):
        hint = f"try a lower learning rate (--lr, now {lr})"
        if a.optimizer == "lbfgs":
            hint += ", or --optimizer adam"
        if a.input_convention == "torchvision":
            hint += (", or --input-convention caffe if the weights are Caffe's "
                     "(BGR, 0–255, mean-subtracted)")
        reason = f"{what}; {hint}; --keep-going runs on regardless"
        if not a.keep_going:
            raise jc.JobError(f"style diverged: {reason}")
        print(f"warning: style diverged (running on, --keep-going): {reason}", file=sys.stderr)
        diverged.append(reason)

    def record(step, loss):
        history.append(loss)
        what = None if diverged else divergence(history)
        if what is not None:
            diverge(what)
        if a.every is not None and step % a.every == 0:
            path = frame_path(a.out, step)
            jc.write_png(transfer.image, path)
            frames.append(path)

    if a.optimizer == "adam":
        adam = torch.optim.Adam([transfer.image], lr=lr)
        for step in range(1, a.steps + 1):
            loss = evaluate()["total"]
            adam.step()
            adam.zero_grad()
            transfer.clamp_image()
            record(step, loss)
    else:
        lbfgs = torch.optim.LBFGS([transfer.image], lr=lr, max_iter=1)

        def closure():
            transfer.clamp_image()
            return torch.tensor(evaluate()["total"])

        for step in range(1, a.steps + 1):
            record(step, float(lbfgs.step(closure)))
    transfer.clamp_image()
    final = transfer.losses()
    what = None if diverged else divergence_at_end(history, final["total"])
    if what is not None:
        diverge(what)
    jc.write_png(transfer.image, a.out)
    _, _, h, w = transfer.image.shape
    return {
        "model": a.model,
        "random_init": a.weights is None,
        "optimizer": OPTIMIZER_NAMES[a.optimizer],
        "lr": lr,
        "input_convention": a.input_convention,
        "init": a.init,
        "steps": a.steps,
        "height": h,
        "width": w,
        "device": jc.device_name(device),
        "content_weight": a.content_weight,
        "style_weight": a.style_weight,
        "losses": final,
        "history": history,
        "diverged": diverged[0] if diverged else None,
        "written": a.out,
        "frames": frames,
        "memory": jc.memory_report(meter, device),
        "seconds": time.perf_counter() - start,
    }


def describe(r):
    s = "note: no --weights given: the VGG is randomly initialised\n" if r["random_init"] else ""
    s += (f"{r['model']} on {r['device']}: {r['height']}×{r['width']} image, {r['steps']} "
          f"{r['optimizer']} steps (lr {r['lr']}) in {r['seconds']:.1f} s, written to {r['written']}\n")
    if r["input_convention"] == "caffe":
        s += "input as Caffe's weights expect it: BGR, 0–255, mean subtracted\n"
    if r["frames"]:
        s += f"{len(r['frames'])} frames written next to it\n"
    first = r["history"][0] if r["history"] else float("nan")
    lo = r["losses"]
    s += (f"loss: content {lo['content']:.4e}  style {lo['style']:.4e}  total {lo['total']:.4e} "
          f"(first step {first:.4e})\n")
    return s + jc.describe_memory(r["memory"], "step")


def main(argv=None):
    a = parse_args(argv)
    jc.set_threads_from_env()
    jc.main_guard(lambda: jc.emit(run(a), a.json, describe))


if __name__ == "__main__":
    main()
