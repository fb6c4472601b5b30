"""PyTorch checkpoints that leangrad resumes (tests/checkpoint_pytorch.rs).

For Adam and AdamW: a Linear(4, 8) → ReLU → Linear(8, 3) model trained 3
steps (MSE on seeded random batches), written as a leangrad checkpoint
folder `tests/fixtures/checkpoints/torch_<kind>/`:

* `model.safetensors`: `model.state_dict()` (PyTorch's names `0.weight`…);
* `optimizer.safetensors`: `optimizer.state_dict()["state"]`'s tensors as
  `state.{param_id}.exp_avg` / `state.{param_id}.exp_avg_sq`;
* `checkpoint.json`: `param_groups` (hyper-parameters, ids, names), each
  parameter's `step`, the update count;

and beside it `continuation.safetensors`: the batches of steps 4 and 5
(`x3`, `y3`, `x4`, `y4`) and what PyTorch holds after them (`model.*` and
`state.*`). Run from the repository root:

    python3 python-compare/checkpoint_fixture.py

`--verify DIR KIND` goes the other way: loads the leangrad checkpoint in DIR
(written by the Rust test with LEANGRAD_CHECKPOINT_EXPORT=DIR set; it holds
the state after the 5 steps) into a fresh PyTorch model and optimizer with
`safetensors.torch.load_file` + `load_state_dict`, and checks both against
PyTorch's own 5-step run.
"""

import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

OUT = os.path.join("tests", "fixtures", "checkpoints")
FIRST, TOTAL = 3, 5
KINDS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.001),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05),
}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 4, generator=g), torch.randn(6, 3, generator=g)) for _ in range(TOTAL)]


def train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def optimizer_tensors(opt):
    out = {}
    for pid, st in opt.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if key in st:
                out[f"state.{pid}.{key}"] = st[key].detach().contiguous().clone()
    return out


def manifest(model, opt, kind):
    sd = opt.state_dict()
    names = [n for n, _ in model.named_parameters()]
    groups = []
    for g in sd["param_groups"]:
        group = {k: v for k, v in g.items() if isinstance(v, (bool, int, float, list))}
        group["betas"] = list(g["betas"])
        group["decoupled_weight_decay"] = kind == "adamw"
        group["params"] = list(g["params"])
        group["param_names"] = [names[i] for i in g["params"]]
        groups.append(group)
    return {
        "format": "leangrad-checkpoint",
        "version": 1,
        "progress": {"epoch": 0, "step": FIRST},
        "optimizer": {
            "kind": "Adam",
            "param_groups": groups,
            "state": {str(pid): {"step": int(st["step"])} for pid, st in sd["state"].items()},
            "steps": FIRST,
        },
        "metadata": {"written_by": f"torch {torch.__version__}"},
    }


def write(kind):
    data = batches()
    model = make_model()
    opt = KINDS[kind](model.parameters())
    train(model, opt, data[:FIRST])
    folder = os.path.join(OUT, f"torch_{kind}")
    os.makedirs(folder, exist_ok=True)
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(folder, "model.safetensors"))
    save_file(optimizer_tensors(opt), os.path.join(folder, "optimizer.safetensors"))
    with open(os.path.join(folder, "checkpoint.json"), "w") as f:
        json.dump(manifest(model, opt, kind), f, indent=2)
    train(model, opt, data[FIRST:])
    cont = {}
    for i in range(FIRST, TOTAL):
        cont[f"x{i}"], cont[f"y{i}"] = data[i]
    for k, v in model.state_dict().items():
        cont[f"model.{k}"] = v.detach().contiguous().clone()
    cont.update(optimizer_tensors(opt))
    save_file(cont, os.path.join(OUT, f"torch_{kind}_continuation.safetensors"))
    print(f"wrote {folder} and its continuation")


def verify(folder, kind):
    """Loads a leangrad checkpoint into PyTorch and compares with PyTorch's run."""
    data = batches()
    reference = make_model()
    ref_opt = KINDS[kind](reference.parameters())
    train(reference, ref_opt, data)

    torch.manual_seed(123)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")), strict=True)
    opt = KINDS[kind](model.parameters())
    with open(os.path.join(folder, "checkpoint.json")) as f:
        meta = json.load(f)["optimizer"]
    tensors = load_file(os.path.join(folder, "optimizer.safetensors"))
    state = {}
    for pid, st in meta["state"].items():
        state[int(pid)] = {"step": torch.tensor(float(st["step"]))}
    for name, t in tensors.items():
        _, pid, key = name.split(".", 2)
        state[int(pid)][key] = t
    groups = opt.state_dict()["param_groups"]
    for g, saved in zip(groups, meta["param_groups"]):
        g["lr"] = saved["lr"]
    opt.load_state_dict({"state": state, "param_groups": groups})
    worst = 0.0
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        worst = max(worst, (p - q).abs().max().item())
    for pid, st in ref_opt.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            worst = max(worst, (opt.state_dict()["state"][pid][key] - st[key]).abs().max().item())
    print(f"{kind}: leangrad checkpoint loaded into PyTorch; max |difference| = {worst:.3g}")
    assert worst < 1e-6, worst


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--verify":
        verify(sys.argv[2], sys.argv[3])
        return
    for kind in KINDS:
        write(kind)


if __name__ == "__main__":
    main()
