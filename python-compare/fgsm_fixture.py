"""One FGSM step in PyTorch, for tests/jobs_adversarial.rs.

A small ResNet (export.py's, torchvision's names: basic blocks [2, 2, 2, 2],
width 2, 5 classes, 3 input channels) with random BatchNorm statistics, in
evaluation mode with every parameter frozen; images in [0, 1] normalised
with ImageNet's mean and std inside the differentiated function, as
`leangrad adversarial` does. Writes tests/fixtures/adversarial/fgsm.safetensors:
the state dict (`model.*`), the images, labels, the input gradient of the
mean cross-entropy and the adversarial images for eps = 8/255.

Run from the repository root: python3 python-compare/fgsm_fixture.py
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from export import BasicBlock, ResNet, randomise_bn  # noqa: E402

torch.manual_seed(0)
model = ResNet(BasicBlock, [2, 2, 2, 2], 2, 5, 3)
randomise_bn(model, (8, 3, 32, 32), 0)
model.eval()
for p in model.parameters():
    p.requires_grad_(False)

x = torch.rand(4, 3, 32, 32)
labels = torch.tensor([0, 1, 2, 3])
mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
eps = 8 / 255

xg = x.clone().requires_grad_(True)
loss = F.cross_entropy(model((xg - mean) / std), labels)
loss.backward()
adv = (x + eps * xg.grad.sign()).clamp(0, 1)

tensors = {f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}
tensors.update(
    images=x, labels=labels, grad=xg.grad, adversarial=adv, loss=loss.detach().reshape(1)
)
os.makedirs("tests/fixtures/adversarial", exist_ok=True)
save_file(tensors, "tests/fixtures/adversarial/fgsm.safetensors")
print("loss", loss.item(), "smallest |grad|", xg.grad.abs().min().item())
