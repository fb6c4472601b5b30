"""Writes tests/fixtures/data/pad_grid.safetensors for tests/data_pad_grid.rs:
torchvision's `F.pad` of a small [3, 4, 5] image in each padding mode
(constant with a fill, edge, reflect, symmetric; asymmetric paddings), and
`make_grid` of a batch of 5 such images (nrow 2, padding 1, pad_value 0.5;
and save_image's defaults nrow 8, padding 2), plus the 1-channel case
(make_grid repeats it to 3 channels). Run from the repository root:

    python3 python-compare/pad_grid_fixture.py
"""

import os

import torch
import torchvision.transforms.functional as TF
from safetensors.torch import save_file
from torchvision.utils import make_grid

OUT = os.path.join("tests", "fixtures", "data", "pad_grid.safetensors")

image = torch.arange(3 * 4 * 5, dtype=torch.float32).reshape(3, 4, 5) / 60.0
batch = torch.stack([image + k / 10.0 for k in range(5)])
out = {"image": image, "batch": batch}
# torchvision's padding list: [left, top, right, bottom].
for name, padding in {"a": [1, 2, 3, 0], "b": [3, 1, 0, 2]}.items():
    out[f"pad_{name}_constant"] = TF.pad(image, padding, fill=0.25, padding_mode="constant")
    for mode in ["edge", "reflect", "symmetric"]:
        out[f"pad_{name}_{mode}"] = TF.pad(image, padding, padding_mode=mode)
out["grid_2_1"] = make_grid(batch, nrow=2, padding=1, pad_value=0.5)
out["grid_default"] = make_grid(batch)
out["gray_batch"] = batch[:, :1]
out["grid_gray"] = make_grid(batch[:, :1], nrow=3)
save_file({k: v.contiguous() for k, v in out.items()}, OUT)
print(f"wrote {OUT}: {sorted(out)}")
