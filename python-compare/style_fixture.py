"""PyTorch reference for `leangrad style` (neural style transfer, Gatys et
al., as PyTorch's tutorial computes it) on a tiny VGG.

The tiny VGG is torchvision's VGG layout with the plan [4, 4, M, 8, 8, M, 8]
(names features.0 … features.11); style layers are the conv outputs
features.0, 5, 10, the content layer features.7. The images are two small
random PNGs, read as RGB in [0, 1] and resized so the shorter side is 12
(antialiased bilinear, aspect kept: 16×20 → 12×15, 18×18 → 12×12). The
ImageNet normalisation is applied inside the model's input. Gram matrices
are F·Fᵀ / (C·H·W); content and style losses are mean-squared errors,
weighted by CONTENT_WEIGHT and STYLE_WEIGHT. The image starts as the
content image and is clamped to [0, 1] as the tutorial does.

Two runs of STEPS steps each, recording the weighted content, style and
total loss of every evaluation and the losses of the final (clamped)
image:
- Adam (lr 0.05): loss, backward, step, clamp;
- L-BFGS (lr 1, max_iter 1 per step, PyTorch's other defaults): the
  tutorial's closure (clamp, loss, backward), one iteration per step.

Run:  python python-compare/style_fixture.py   (needs torchvision, PIL, safetensors)
Writes tests/fixtures/style/{content.png, style.png,
tiny_vgg_features.safetensors, losses.json}.
"""

import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from PIL import Image
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "style")
PLAN = [4, 4, "M", 8, 8, "M", 8]
STYLE_LAYERS = [0, 5, 10]
CONTENT_LAYERS = [7]
SIZE = 12
STEPS = 4
CONTENT_WEIGHT = 1.0
STYLE_WEIGHT = 1000.0
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)


class TinyVgg(nn.Module):
    def __init__(self):
        super().__init__()
        layers, cin = [], 3
        for v in PLAN:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=False)]
                cin = v
        self.features = nn.Sequential(*layers)


def write_png(path, h, w, seed):
    g = np.random.default_rng(seed)
    # Smooth content: a gradient plus noise, so resizing matters.
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([yy / h, xx / w, (yy + xx) / (h + w)], axis=-1)
    img = np.clip(base * 160 + g.integers(0, 90, size=(h, w, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(img, "RGB").save(path)


def read(path):
    img = TF.to_tensor(Image.open(path).convert("RGB"))
    return TF.resize(img, SIZE, antialias=True).unsqueeze(0)


def gram(f):
    a, b, c, d = f.size()
    x = f.view(a * b, c * d)
    return (x @ x.t()).div(a * b * c * d)


def features(model, x):
    out, h = {}, (x - MEAN) / STD
    for i, layer in enumerate(model.features):
        h = layer(h)
        out[i] = h
        if i >= max(STYLE_LAYERS + CONTENT_LAYERS):
            break
    return out


def losses(model, img, content_t, style_t):
    f = features(model, img)
    c = sum(F.mse_loss(f[i], content_t[i]) for i in CONTENT_LAYERS) * CONTENT_WEIGHT
    s = sum(F.mse_loss(gram(f[i]), style_t[i]) for i in STYLE_LAYERS) * STYLE_WEIGHT
    return c, s


def record(c, s):
    return {"content": c.item(), "style": s.item(), "total": (c + s).item()}


def run(model, content, style, optimizer):
    with torch.no_grad():
        fc, fs = features(model, content), features(model, style)
        content_t = {i: fc[i] for i in CONTENT_LAYERS}
        style_t = {i: gram(fs[i]) for i in STYLE_LAYERS}
    img = content.clone().requires_grad_(True)
    history = []
    if optimizer == "adam":
        opt = torch.optim.Adam([img], lr=0.05)
        for _ in range(STEPS):
            opt.zero_grad()
            c, s = losses(model, img, content_t, style_t)
            (c + s).backward()
            history.append(record(c, s))
            opt.step()
            with torch.no_grad():
                img.clamp_(0, 1)
    else:
        opt = torch.optim.LBFGS([img], lr=1.0, max_iter=1)

        def closure():
            with torch.no_grad():
                img.clamp_(0, 1)
            opt.zero_grad()
            c, s = losses(model, img, content_t, style_t)
            (c + s).backward()
            history.append(record(c, s))
            return c + s

        for _ in range(STEPS):
            opt.step(closure)
    with torch.no_grad():
        img.clamp_(0, 1)
        final = record(*losses(model, img, content_t, style_t))
    return {"history": history, "final": final, "image": img.detach().reshape(-1).tolist()}


def main():
    os.makedirs(OUT, exist_ok=True)
    write_png(os.path.join(OUT, "content.png"), 16, 20, 1)
    write_png(os.path.join(OUT, "style.png"), 18, 18, 2)
    torch.manual_seed(0)
    model = TinyVgg().eval().requires_grad_(False)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        os.path.join(OUT, "tiny_vgg_features.safetensors"),
    )
    content = read(os.path.join(OUT, "content.png"))
    style = read(os.path.join(OUT, "style.png"))
    result = {
        "torch": torch.__version__,
        "size": SIZE,
        "content_shape": list(content.shape),
        "style_shape": list(style.shape),
        "content_weight": CONTENT_WEIGHT,
        "style_weight": STYLE_WEIGHT,
        "adam_lr": 0.05,
        "steps": STEPS,
        "adam": run(model, content, style, "adam"),
        "lbfgs": run(model, content, style, "lbfgs"),
    }
    with open(os.path.join(OUT, "losses.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    for k in ("adam", "lbfgs"):
        print(k, [round(h["total"], 6) for h in result[k]["history"]], result[k]["final"])


if __name__ == "__main__":
    main()
