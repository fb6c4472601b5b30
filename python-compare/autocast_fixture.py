"""Writes tests/fixtures/autocast.safetensors for tests/device_autocast.rs: a
training step's loss and gradients under bf16 autocast, from PyTorch.

1. The tiny GPT-2 of tests/fixtures/models/gpt2_tiny.safetensors (Hugging
   Face's GPT2LMHeadModel, head tied to `wte`, SDPA attention) in f32 under
   `torch.autocast("cpu", dtype=torch.bfloat16)`. For this model PyTorch's
   CPU and CUDA autocast lists agree: every layer norm reads the f32
   residual stream, the products (addmm, SDPA, the head) run in bf16, the
   loss in f32.
2. A small convolutional net (conv, batch norm, ReLU, strided conv, ReLU,
   linear, cross-entropy) with the casts of leangrad's autocast written out
   (PyTorch's CPU autocast would keep the batch norm in bf16): convolutions
   and the linear layer in bf16 on bf16 copies of the f32 weights, the
   batch norm in f32 on an f32 copy of its bf16 input with its output in
   bf16 (as cuDNN's under PyTorch's CUDA autocast), the loss in f32. The
   f32 step (no autocast) is stored too.

Needs torch, safetensors, transformers. From the repository root:

    python3 python-compare/autocast_fixture.py
"""

import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

OUT = os.path.join("tests", "fixtures", "autocast.safetensors")
BF16 = torch.bfloat16
torch.manual_seed(0)
out = {}

# ---- 1. tiny GPT-2 under torch.autocast ----
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

# export_transformers.py's tiny configuration.
cfg = GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2, n_inner=32,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
cfg._attn_implementation = "sdpa"
model = GPT2LMHeadModel(cfg)
assert model.config._attn_implementation == "sdpa"
state = load_file(os.path.join("tests", "fixtures", "models", "gpt2_tiny.safetensors"))
missing, unexpected = model.transformer.load_state_dict(state, strict=False)
assert not unexpected and all("attn.bias" in m or "masked_bias" in m for m in missing), (missing, unexpected)
ids = torch.randint(0, 50, (2, 12))
targets = torch.randint(0, 50, (24,))
with torch.autocast("cpu", dtype=BF16):
    logits = model(ids).logits
    assert logits.dtype == BF16
    loss = F.cross_entropy(logits.reshape(-1, 50), targets)
assert loss.dtype == torch.float32
loss.backward()
out["gpt2.ids"] = ids
out["gpt2.targets"] = targets
out["gpt2.loss"] = loss.detach()
for name, p in model.transformer.named_parameters():
    assert p.grad.dtype == torch.float32
    out[f"gpt2.grad.{name}"] = p.grad

# ---- 2. a conv net with leangrad's casts written out ----
x = torch.randn(4, 3, 8, 8)
conv1_w, conv1_b = torch.randn(6, 3, 3, 3) * 0.3, torch.randn(6) * 0.1
bn_w, bn_b = 1.0 + 0.1 * torch.randn(6), 0.1 * torch.randn(6)
conv2_w, conv2_b = torch.randn(8, 6, 3, 3) * 0.2, torch.randn(8) * 0.1
fc_w, fc_b = torch.randn(5, 8 * 4 * 4) * 0.1, torch.randn(5) * 0.1
labels = torch.randint(0, 5, (4,))
inputs = {"x": x, "conv1.weight": conv1_w, "conv1.bias": conv1_b, "bn.weight": bn_w,
          "bn.bias": bn_b, "conv2.weight": conv2_w, "conv2.bias": conv2_b, "fc.weight": fc_w,
          "fc.bias": fc_b}


def conv_net(t, autocast):
    low = (lambda a: a.to(BF16)) if autocast else (lambda a: a)
    h = F.conv2d(low(t["x"]), low(t["conv1.weight"]), low(t["conv1.bias"]), padding=1)
    h = F.batch_norm(h.float(), None, None, t["bn.weight"], t["bn.bias"], training=True)
    h = F.relu(low(h))
    h = F.conv2d(low(h), low(t["conv2.weight"]), low(t["conv2.bias"]), stride=2, padding=1)
    h = F.relu(h).flatten(1)
    logits = F.linear(low(h), low(t["fc.weight"]), low(t["fc.bias"]))
    if autocast:
        assert logits.dtype == BF16
    return F.cross_entropy(logits.float(), labels)


out["conv.labels"] = labels
for k, v in inputs.items():
    out[f"conv.{k}"] = v
for tag, autocast in [("bf16", True), ("f32", False)]:
    t = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    loss = conv_net(t, autocast)
    loss.backward()
    out[f"conv.{tag}.loss"] = loss.detach()
    for k, v in t.items():
        assert v.grad.dtype == torch.float32
        out[f"conv.{tag}.grad.{k}"] = v.grad

save_file({k: v.contiguous() for k, v in out.items()}, OUT)
print(f"wrote {OUT}: {len(out)} tensors; gpt2 loss {out['gpt2.loss'].item():.6f}, "
      f"conv loss bf16 {out['conv.bf16.loss'].item():.6f} f32 {out['conv.f32.loss'].item():.6f}")
