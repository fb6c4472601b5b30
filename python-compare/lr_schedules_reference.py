"""PyTorch reference for leangrad's LR schedules: the lr used at each of 25
optimizer steps (read before `opt.step()`, scheduler stepped after it) for
StepLR, CosineAnnealingLR, LinearLR and SequentialLR(LinearLR -> Cosine).

Run:  python python-compare/lr_schedules_reference.py
Writes tests/fixtures/lr_schedules.json.
"""

import json
import os

import torch
from torch.optim import lr_scheduler as S

STEPS = 25
BASE_LR = 0.1


def run(make):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=BASE_LR)
    sched = make(opt)
    lrs = []
    for _ in range(STEPS):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def main():
    out = {
        "base_lr": BASE_LR,
        "step": run(lambda o: S.StepLR(o, step_size=4, gamma=0.5)),
        "cosine": run(lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.001)),
        "linear": run(lambda o: S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=5)),
        "warmup_cosine": run(
            lambda o: S.SequentialLR(
                o,
                [
                    S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=5),
                    S.CosineAnnealingLR(o, T_max=15, eta_min=0.001),
                ],
                milestones=[5],
            )
        ),
    }
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "tests", "fixtures", "lr_schedules.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
