"""Writes the image and transform fixtures of tests/data_transforms.rs.

Makes a few small images with deterministic pixel patterns (PNG, one BMP,
one JPEG) in `tests/fixtures/data/`, reads them the way torchvision's
`ImageFolder` does (PIL, `convert("RGB")`, `to_tensor`), applies
torchvision's tensor transforms (antialiased bilinear `resize`,
`center_crop`, `hflip`, `normalize`) and saves every result in
`tests/fixtures/data/torchvision.safetensors`. Also the bytes torchvision's
`save_image` writes for values around the rounding edges. Needs `torch`,
`torchvision`, `safetensors`, `pillow`, `numpy`. Run from the repository
root:

    python3 python-compare/data_fixtures.py
"""

import io
import os

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image
from safetensors.torch import save_file
from torchvision.utils import save_image

OUT = os.path.join("tests", "fixtures", "data")
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def pattern(h, w, channels, salt):
    """Smooth gradients plus a high-frequency checker, so resizing has both
    low and high frequencies to filter."""
    y, x = np.mgrid[0:h, 0:w]
    planes = []
    for c in range(channels):
        v = (x * (7 + c) + y * (3 + 2 * c) + salt * 31) % 256
        v = np.where((x + y + c) % 2 == 0, v, 255 - v)
        planes.append(v)
    return np.stack(planes, axis=-1).astype(np.uint8)


def load_rgb(path):
    with Image.open(path) as img:
        return TF.to_tensor(img.convert("RGB"))


def main():
    os.makedirs(OUT, exist_ok=True)
    images = {
        "rgb_37x53.png": Image.fromarray(pattern(37, 53, 3, 1), "RGB"),
        "rgb_23x31.png": Image.fromarray(pattern(23, 31, 3, 2), "RGB"),
        "rgb_5x7.png": Image.fromarray(pattern(5, 7, 3, 3), "RGB"),
        "gray_6x4.png": Image.fromarray(pattern(6, 4, 1, 4)[:, :, 0], "L"),
        "rgba_4x5.png": Image.fromarray(pattern(4, 5, 4, 5), "RGBA"),
        "rgb_9x11.bmp": Image.fromarray(pattern(9, 11, 3, 6), "RGB"),
        "rgb_16x24.jpg": Image.fromarray(pattern(16, 24, 3, 7), "RGB"),
    }
    for name, img in images.items():
        img.save(os.path.join(OUT, name))

    out = {}
    for name in images:
        out[f"to_tensor/{name}"] = load_rgb(os.path.join(OUT, name))

    big = out["to_tensor/rgb_37x53.png"]
    mid = out["to_tensor/rgb_23x31.png"]
    small = out["to_tensor/rgb_5x7.png"]
    aa = dict(interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
    out["resize/37x53_shorter16"] = TF.resize(big, 16, **aa)
    out["resize/23x31_to_8x12"] = TF.resize(mid, [8, 12], **aa)
    out["resize/5x7_to_9x13"] = TF.resize(small, [9, 13], **aa)
    out["resize/23x31_to_30x12"] = TF.resize(mid, [30, 12], **aa)
    out["resize/37x53_to_5x3"] = TF.resize(big, [5, 3], **aa)
    out["resize/batch_to_7x9"] = TF.resize(torch.stack([mid, mid.flip(-1)]), [7, 9], **aa)
    out["center_crop/37x53_to_20x30"] = TF.center_crop(big, [20, 30])
    out["center_crop/23x31_to_10x11"] = TF.center_crop(mid, [10, 11])
    out["center_crop/5x7_to_8x9"] = TF.center_crop(small, [8, 9])
    out["hflip/23x31"] = TF.hflip(mid)
    out["normalize/37x53"] = TF.normalize(big, MEAN, STD)
    # The usual evaluation pipeline: Resize(16), CenterCrop(14), Normalize.
    out["pipeline/37x53"] = TF.normalize(
        TF.center_crop(TF.resize(big, 16, **aa), [14, 14]), MEAN, STD)

    # save_image's rounding: values at and around the edges of the 8-bit
    # steps, outside [0, 1], and one NaN-free random spread.
    edges = torch.tensor([0.0, 1.0, -0.5, 1.5, 0.5 / 255, 0.49 / 255, 0.51 / 255,
                          254.5 / 255, 254.49 / 255, 0.5, 1 / 3, 2 / 3])
    spread = torch.linspace(-0.01, 1.01, 3 * 4 * 5 - edges.numel())
    to_save = torch.cat([edges, spread]).reshape(3, 4, 5)
    buf = io.BytesIO()
    save_image(to_save, buf, format="png")
    buf.seek(0)
    with Image.open(buf) as saved:
        saved_u8 = torch.from_numpy(np.array(saved)).permute(2, 0, 1).contiguous()
    out["save_image/input"] = to_save
    out["save_image/u8"] = saved_u8

    save_file({k: v.contiguous() for k, v in out.items()},
              os.path.join(OUT, "torchvision.safetensors"))
    for k, v in out.items():
        print(k, tuple(v.shape), v.dtype)


if __name__ == "__main__":
    main()
