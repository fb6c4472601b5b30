"""Writes tests/fixtures/linear_cross_entropy.safetensors for
tests/loss_linear_ce.rs: PyTorch's `F.cross_entropy(h @ W.T + b, t)` in
float64 and its gradients with respect to h, W and b, for reductions mean,
sum and none, with ignored targets (-100) and label smoothing 0.1; and the
next-token loss of the tiny GPT-2 of tests/fixtures/models/gpt2_tiny.safetensors
(Hugging Face's GPT2LMHeadModel, head tied to `wte`) with every parameter's
gradient. Needs torch, safetensors, transformers. From the repository root:

    python3 python-compare/linear_ce_fixture.py
"""

import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

OUT = os.path.join("tests", "fixtures", "linear_cross_entropy.safetensors")
torch.manual_seed(0)
out = {}

n, d, v = 40, 8, 50
h = torch.randn(n, d, dtype=torch.float64)
w = torch.randn(v, d, dtype=torch.float64) * 0.5
b = torch.randn(v, dtype=torch.float64) * 0.1
t = torch.randint(0, v, (n,))
t[[3, 17, 31]] = -100
out.update({"h": h, "w": w, "b": b, "t": t})
for reduction in ["mean", "sum", "none"]:
    for smoothing in [0.0, 0.1]:
        key = f"{reduction}_{smoothing}"
        hh, ww, bb = (x.clone().requires_grad_(True) for x in (h, w, b))
        loss = F.cross_entropy(hh @ ww.T + bb, t, reduction=reduction, label_smoothing=smoothing)
        probe = torch.randn(loss.shape, dtype=torch.float64) if reduction == "none" else torch.ones((), dtype=torch.float64)
        (loss * probe).sum().backward()
        out[f"{key}.probe"] = probe
        out[f"{key}.loss"] = loss.detach()
        out[f"{key}.grad_h"] = hh.grad
        out[f"{key}.grad_w"] = ww.grad
        out[f"{key}.grad_b"] = bb.grad

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

# export_transformers.py's tiny configuration.
cfg = GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2, n_inner=32,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(cfg).double()
state = load_file(os.path.join("tests", "fixtures", "models", "gpt2_tiny.safetensors"))
missing, unexpected = model.transformer.load_state_dict({k: v.double() for k, v in state.items()}, strict=False)
assert not unexpected and all("attn.bias" in m or "masked_bias" in m for m in missing), (missing, unexpected)
ids = torch.randint(0, 50, (2, 12))
targets = torch.randint(0, 50, (24,))
targets[5] = -100
logits = model(ids).logits
loss = F.cross_entropy(logits.reshape(-1, 50), targets)
loss.backward()
out["gpt2.ids"] = ids
out["gpt2.targets"] = targets
out["gpt2.loss"] = loss.detach()
for name, p in model.transformer.named_parameters():
    out[f"gpt2.grad.{name}"] = p.grad
save_file({k: x.contiguous() for k, x in out.items()}, OUT)
print(f"wrote {OUT}: {len(out)} tensors, gpt2 loss {loss.item():.6f}")
