"""PyTorch reference for leangrad's Adam: 20 steps on a fixed tiny model.

Model: Linear(4->8), tanh, Linear(8->3); loss = MSE (mean) on fixed data.
Everything is float64. Weights and data are written out below (and copied
into the fixture) so that leangrad builds exactly the same model.

Run:  python python-compare/adam_reference.py
Writes tests/fixtures/adam_reference.json (loss before each of the 20 steps).
"""

import json
import os

import torch

torch.set_default_dtype(torch.float64)

STEPS = 20
LR = 0.05
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.0


def grid(rows, cols, a, b, c):
    """A deterministic, irregular-looking matrix written as plain numbers."""
    return [
        [round(((i * a + j * b + c) % 17) / 8.5 - 1.0, 6) for j in range(cols)]
        for i in range(rows)
    ]


W1 = grid(8, 4, 5, 3, 1)
B1 = [round(0.1 * ((i * 7) % 5) - 0.2, 6) for i in range(8)]
W2 = grid(3, 8, 3, 7, 2)
B2 = [0.05, -0.1, 0.15]
X = grid(6, 4, 2, 9, 4)
Y = grid(6, 3, 11, 5, 3)


def run(make_opt):
    """Losses before each of STEPS steps of the optimizer `make_opt(params)`."""
    fc1 = torch.nn.Linear(4, 8)
    fc2 = torch.nn.Linear(8, 3)
    with torch.no_grad():
        fc1.weight.copy_(torch.tensor(W1))
        fc1.bias.copy_(torch.tensor(B1))
        fc2.weight.copy_(torch.tensor(W2))
        fc2.bias.copy_(torch.tensor(B2))
    x = torch.tensor(X)
    y = torch.tensor(Y)
    params = list(fc1.parameters()) + list(fc2.parameters())
    opt = make_opt(params)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(fc2(torch.tanh(fc1(x))), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    return losses


def main():
    losses = run(
        lambda p: torch.optim.Adam(
            p, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, foreach=False
        )
    )
    # Other algorithms on the same model (hyper-parameters in the key).
    extra = {
        "adamw_lr0.05_wd0.1_amsgrad": run(
            lambda p: torch.optim.AdamW(
                p, lr=0.05, weight_decay=0.1, amsgrad=True, foreach=False
            )
        ),
        "adam_lr0.02_wd0.05_betas0.8_0.99": run(
            lambda p: torch.optim.Adam(
                p, lr=0.02, weight_decay=0.05, betas=(0.8, 0.99), foreach=False
            )
        ),
        "sgd_lr0.1_momentum0.9_nesterov_wd0.01": run(
            lambda p: torch.optim.SGD(
                p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=False
            )
        ),
        "sgd_lr0.1_momentum0.5_dampening0.2": run(
            lambda p: torch.optim.SGD(
                p, lr=0.1, momentum=0.5, dampening=0.2, foreach=False
            )
        ),
    }
    out = {
        "dtype": "f64",
        "torch_version": torch.__version__,
        "steps": STEPS,
        "lr": LR,
        "betas": list(BETAS),
        "eps": EPS,
        "weight_decay": WEIGHT_DECAY,
        "w1": W1,
        "b1": B1,
        "w2": W2,
        "b2": B2,
        "x": X,
        "y": Y,
        "losses": losses,
        "extra": extra,
    }
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "tests", "fixtures", "adam_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(path)}: loss {losses[0]:.6f} -> {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
