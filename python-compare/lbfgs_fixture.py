"""PyTorch reference for leangrad's L-BFGS (torch.optim.LBFGS), in float64.

Four cases, each a few `step(closure)` calls from a fixed start:
- Rosenbrock in 4 dimensions (one parameter), with and without the
  strong-Wolfe line search;
- least squares ||W a + b - y||² (two parameters, W [2, 3] and b [2]),
  with and without the line search, with a history of 3 (so old pairs are
  dropped).
After every step the fixture records the loss `step` returned, the total
function evaluations and every parameter's values.

Run:  python python-compare/lbfgs_fixture.py
Writes tests/fixtures/lbfgs.json.
"""

import json
import os

import torch

torch.set_default_dtype(torch.float64)


def rosenbrock(params):
    (x,) = params
    return (100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2).sum()


# Fixed data for the least-squares problem: y = W* a + b* + noise.
A = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [-1.0, 0.75, 1.0], [0.0, 2.0, -1.5], [1.0, 1.0, 1.0]]
Y = [[1.0, -2.0], [0.5, 3.0], [2.5, -0.5], [-1.0, 1.5], [0.25, 0.75]]


def least_squares(params):
    w, b = params
    a = torch.tensor(A)
    y = torch.tensor(Y)
    r = a @ w.t() + b - y
    return (r * r).sum()


CASES = [
    {
        "name": "rosenbrock",
        "loss": "rosenbrock",
        "start": [[-1.2, 1.0, -0.5, 0.8]],
        "options": {"lr": 1.0, "max_iter": 6, "history_size": 10, "line_search_fn": None},
        "steps": 4,
    },
    {
        "name": "rosenbrock_wolfe",
        "loss": "rosenbrock",
        "start": [[-1.2, 1.0, -0.5, 0.8]],
        "options": {"lr": 1.0, "max_iter": 8, "history_size": 10, "line_search_fn": "strong_wolfe"},
        "steps": 5,
    },
    {
        "name": "least_squares",
        "loss": "least_squares",
        "start": [[[0.1, -0.2, 0.3], [0.0, 0.5, -0.4]], [0.2, -0.1]],
        "options": {"lr": 0.5, "max_iter": 5, "history_size": 3, "line_search_fn": None},
        "steps": 3,
    },
    {
        "name": "least_squares_wolfe",
        "loss": "least_squares",
        "start": [[[0.1, -0.2, 0.3], [0.0, 0.5, -0.4]], [0.2, -0.1]],
        "options": {"lr": 1.0, "max_iter": 4, "history_size": 3, "line_search_fn": "strong_wolfe"},
        "steps": 3,
    },
]


def run(case):
    params = [torch.tensor(s, requires_grad=True) for s in case["start"]]
    f = {"rosenbrock": rosenbrock, "least_squares": least_squares}[case["loss"]]
    opt = torch.optim.LBFGS(params, **case["options"])

    def closure():
        opt.zero_grad()
        loss = f(params)
        loss.backward()
        return loss

    steps = []
    for _ in range(case["steps"]):
        loss = opt.step(closure)
        state = opt.state[params[0]]
        steps.append(
            {
                "loss": loss.item(),
                "func_evals": state["func_evals"],
                "n_iter": state["n_iter"],
                "params": [p.detach().reshape(-1).tolist() for p in params],
            }
        )
    return {**case, "history": steps}


def main():
    out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "lbfgs.json")
    cases = [run(c) for c in CASES]
    with open(out, "w") as fh:
        json.dump({"torch": torch.__version__, "cases": cases}, fh, indent=1)
    for c in cases:
        last = c["history"][-1]
        print(c["name"], [round(h["loss"], 6) for h in c["history"]], last["func_evals"], last["params"])


if __name__ == "__main__":
    main()
