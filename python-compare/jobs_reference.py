"""The three jobs of `leangrad finetune`, `leangrad adversarial` and
`leangrad style` in PyTorch eager on the CPU, at the same sizes, for their
times next to leangrad's on the same machine.

Models are export.py's plain-torch rebuilds with torchvision's structure
(ResNet-18, VGG-19 features), randomly initialised; images are random
tensors (leangrad's times also include decoding and writing the images).
Prints one JSON line per job: seconds and the process's peak RSS.

    python3 python-compare/jobs_reference.py --threads 2
"""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from export import VGG, BasicBlock, ResNet  # noqa: E402

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
VGG19 = [64, 64, 0, 128, 128, 0, 256, 256, 256, 256, 0, 512, 512, 512, 512, 0, 512, 512, 512, 512, 0]


def resnet18():
    return ResNet(BasicBlock, [2, 2, 2, 2], 64, 1000, 3)


def report(job, seconds, **extra):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"job": job, "seconds": round(seconds, 3), "peak_rss_mib": round(rss, 1), **extra}))


def adversarial(batch=8, size=224, steps=10, eps=8 / 255, alpha=2 / 255):
    model = resnet18().eval().requires_grad_(False)
    x = torch.rand(batch, 3, size, size)
    with torch.no_grad():
        labels = model((x - MEAN) / STD).argmax(1)
    t = time.perf_counter()
    adv = (x + torch.empty_like(x).uniform_(-eps, eps)).clamp(0, 1)
    for _ in range(steps):
        adv.requires_grad_(True)
        loss = F.cross_entropy(model((adv - MEAN) / STD), labels)
        (g,) = torch.autograd.grad(loss, adv)
        adv = (x + (adv.detach() + alpha * g.sign() - x).clamp(-eps, eps)).clamp(0, 1)
    report("adversarial", time.perf_counter() - t, images=batch, steps=steps)


def finetune(images=32, batch=16, size=224):
    model = resnet18()
    model.fc = torch.nn.Linear(512, 2)
    model.requires_grad_(False)
    model.fc.requires_grad_(True)
    model.eval()  # linear-bn-eval
    opt = torch.optim.SGD(model.fc.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(images, 3, size, size)
    y = torch.randint(0, 2, (images,))
    t = time.perf_counter()
    for i in range(0, images, batch):
        loss = F.cross_entropy(model((x[i:i + batch] - MEAN) / STD), y[i:i + batch])
        loss.backward()
        opt.step()
        opt.zero_grad()
    s = time.perf_counter() - t
    report("finetune", s, images=images, images_per_second=round(images / s, 1))


def style(h=256, w=320, steps=10, lr=0.02):
    vgg = VGG(VGG19, False, 3, 1, 16, 10, 0.0).features.eval().requires_grad_(False)
    style_layers, content_layer = [0, 5, 10, 19, 28], 21

    def feats(img):
        out, x = {}, (img - MEAN) / STD
        for i, layer in enumerate(vgg):
            x = layer(x)
            if i in style_layers or i == content_layer:
                out[i] = x if isinstance(layer, torch.nn.Conv2d) else None
            if i >= 28:
                break
        return out

    def gram(f):
        n, c, hh, ww = f.shape
        m = f.reshape(n * c, hh * ww)
        return m @ m.t() / (n * c * hh * ww)

    content, style_img = torch.rand(1, 3, h, w), torch.rand(1, 3, h, w)
    with torch.no_grad():
        fc, fs = feats(content), feats(style_img)
        targets = {i: gram(fs[i]) for i in style_layers}
    img = content.clone().requires_grad_(True)
    opt = torch.optim.Adam([img], lr=lr)
    t = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        f = feats(img)
        loss = F.mse_loss(f[content_layer], fc[content_layer]) + 1e6 * sum(
            F.mse_loss(gram(f[i]), targets[i]) for i in style_layers)
        loss.backward()
        opt.step()
        with torch.no_grad():
            img.clamp_(0, 1)
    report("style", time.perf_counter() - t, size=[h, w], steps=steps)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", choices=["adversarial", "finetune", "style"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    for job in [a.only] if a.only else ["adversarial", "finetune", "style"]:
        globals()[job]()
