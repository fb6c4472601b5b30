"""Fixture for leangrad's GradScaler: `torch.amp.GradScaler` on the CPU over
sequences of steps with forced and natural overflows.

A bias-free linear map `W` (3×4, f32) trained with SGD (lr 0.1) on the
mean-squared error of `x·Wᵀ` against `y`, every value a formula (no random
numbers), so that leangrad builds the same tensors. Each step multiplies the
loss by its `factor` (1, or inf / nan to force an overflow) before
`scaler.scale`, then backward, `scaler.step`, `scaler.update`.

Scenarios:
- `forced`: init_scale 2⁸, growth_interval 3, overflows at chosen steps.
- `natural`: init_scale 2¹²⁶, growth_interval 1: the scale grows to 2¹²⁷,
  a growth past f32 is not taken, and the steps whose loss is 8× larger
  overflow the scaled loss on their own (no inf given).

Writes tests/fixtures/grad_scaler.json: per scenario the settings and per
step the factor, whether the step was skipped, the scale and growth tracker
after `update`, and `W` after the step.

    python3 python-compare/grad_scaler_fixture.py
"""
import json
import math
import os

import torch


def data():
    x = torch.tensor([[math.sin(7 * i + j) for j in range(4)] for i in range(5)],
                     dtype=torch.float32)
    y = torch.tensor([[math.cos(3 * i + 2 * j) for j in range(3)] for i in range(5)],
                     dtype=torch.float32)
    w = torch.tensor([[0.1 * (i - j) + 0.05 for j in range(4)] for i in range(3)],
                     dtype=torch.float32)
    return x, y, w


def run(init_scale, growth_interval, factors):
    x, y, w = data()
    w.requires_grad_(True)
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    steps = []
    for f in factors:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(x @ w.t(), y) * f
        scaler.scale(loss).backward()
        before = w.detach().clone()
        scaler.step(opt)
        scaler.update()
        skipped = bool(torch.equal(before, w.detach()))
        steps.append({
            "factor": str(f),
            "skipped": skipped,
            "scale": scaler.get_scale(),
            "growth_tracker": int(scaler._growth_tracker.item()),
            "w": [float(v) for v in w.detach().flatten()],
        })
    return {"init_scale": init_scale, "growth_interval": growth_interval, "steps": steps}


def main():
    inf, nan = float("inf"), float("nan")
    forced = [1.0, 1.0, inf, inf, 1.0, 1.0, 1.0, 1.0, nan, 1.0, 1.0, 1.0, 1.0, 1.0]
    out = {
        "torch": torch.__version__,
        "forced": run(2.0 ** 8, 3, forced),
        "natural": run(2.0 ** 126, 1, [1.0, 1.0, 8.0, 8.0, 1.0, 1.0, 1.0]),
    }
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "grad_scaler.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
