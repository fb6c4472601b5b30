"""`leangrad finetune` in PyTorch: the same command-line options (names,
defaults, meanings), the same job and the same `--json` report, for side
by side runs (benches/jobs_side_by_side.py).

A torchvision classifier (`weights=None`, random init, unless `--weights
W.safetensors`, a state_dict loaded with `safetensors.torch.load_file` +
`load_state_dict`, any class count) gets a new head with one output per
class folder (`model.fc = nn.Linear(512, classes)`, or the classifier's
last Linear), is frozen by `--case` (leangrad's rule, jobs_common.py;
default `linear-bn-eval`: only Linear layers train, every BatchNorm in
evaluation mode) and trains with SGD (momentum 0.9), Adam or AdamW
(torch's defaults). `--fused` steps each parameter inside backward as soon
as its gradient is accumulated (`register_post_accumulate_grad_hook`, one
optimizer per parameter, PyTorch's "optimizer step in backward" recipe).
`--checkpoint` runs each residual block (MobileNetV2: each `features.N`)
as a non-reentrant checkpointed segment (`torch.utils.checkpoint(..., use_reentrant=False)`).
Data: torchvision's `ImageFolder` and `DataLoader` (`--workers` processes,
kept between epochs; shuffled by a generator seeded from `--seed` and the
epoch; a resumed run's crops and flips differ from an uninterrupted
run's, its weights and optimizer state do not); training
images `ToTensor, RandomResizedCrop(size), RandomHorizontalFlip`, validation
images `ToTensor, Resize(size·256/224), CenterCrop(size)`, both
ImageNet-normalised; the resizes are torchvision's antialiased tensor
resizes, which leangrad's transforms match. `--out DIR` writes leangrad's
checkpoint layout after every epoch (`model.safetensors` with torchvision's
names, `optimizer.safetensors` with `state.{id}.momentum_buffer` /
`exp_avg` / `exp_avg_sq`, `checkpoint.json`); `--resume DIR` reads it back.

Report fields: those of leangrad's `FinetuneReport` with the same
meanings. What differs: the random numbers (head init, shuffling, crops,
flips) come from torch's generators, not leangrad's Philox streams; and the
`memory` object, explained in jobs_common.py (`lean_step_bytes` is always
null; on the CPU `measured_peak_bytes` is null and `peak_rss_bytes` stands
beside it; the step measured is the run's first training step: forward,
loss, backward and the optimizer's update). Threads: RAYON_NUM_THREADS for
the training step; the decoding workers are separate processes.

    RAYON_NUM_THREADS=2 python python-compare/finetune.py --data train/ --val val/ --json
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobs_common as jc  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision.transforms as T  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

STATE_KEYS = ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
# bitsandbytes' 8-bit optimizers' state (counted in memory, never saved).
BNB_STATE_KEYS = ("state1", "state2", "absmax1", "absmax2", "qmap1", "qmap2")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="finetune.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help=", ".join(jc.CLASSIFIERS))
    p.add_argument("--weights", default=None,
                   help="safetensors or .pt/.pth file of the torchvision model's state_dict()")
    p.add_argument("--strict", default="true", choices=["true", "false"],
                   help="false: load the names that line up, list the others")
    p.add_argument("--strip-prefix", default="", help="remove this prefix from the file's names")
    p.add_argument("--add-prefix", default="", help="put this prefix in front of the file's names")
    p.add_argument("--data", required=True, help="training images, one sub-folder per class")
    p.add_argument("--val", default=None, help="validation images, the same class sub-folders")
    p.add_argument("--case", default="linear-bn-eval", choices=jc.CASES)
    p.add_argument("--epochs", type=int, default=1, help="passes over the training images")
    p.add_argument("--batch", type=int, default=32, help="images per step")
    p.add_argument("--size", type=int, default=224, help="image size")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"])
    p.add_argument("--fused", action="store_true", help="update each parameter inside backward")
    p.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing per residual block")
    p.add_argument("--sync-batchnorm", action="store_true",
                   help="under torchrun: BatchNorm statistics over all ranks' batches (SyncBatchNorm)")
    p.add_argument("--optimizer-state", default="f32", choices=["f32", "bf16", "8bit"],
                   help="8bit: bitsandbytes' 8-bit optimizers; bf16 has no PyTorch counterpart")
    p.add_argument("--autocast", default=None, choices=["bf16", "f16"],
                   help="the training forward and loss under torch.autocast in this dtype")
    p.add_argument("--out", default=None, help="the checkpoint folder written after every epoch")
    p.add_argument("--resume", default=None, help="resume from this checkpoint folder")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffling and the random crops and flips")
    p.add_argument("--workers", type=int, default=2, help="processes decoding images ahead of the step")
    p.add_argument("--skip-bad-images", action="store_true",
                   help="leave out images that cannot be read, with a warning each")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", action="store_true", help="write only JSON to stdout")
    return p.parse_args(argv)


def datasets(a):
    norm = T.Normalize(jc.IMAGENET_MEAN, jc.IMAGENET_STD)
    try:
        train = ImageFolder(a.data, T.Compose([
            T.ToTensor(), T.RandomResizedCrop(a.size, antialias=True), T.RandomHorizontalFlip(), norm]))
        val = None
        if a.val is not None:
            val = ImageFolder(a.val, T.Compose([
                T.ToTensor(), T.Resize(a.size * 256 // 224, antialias=True), T.CenterCrop(a.size), norm]))
    except (FileNotFoundError, OSError) as e:
        raise jc.JobError(str(e)) from e
    if a.skip_bad_images:
        for folder in (train, val):
            if folder is not None:
                folder.samples = jc.readable_images(folder.samples, True)
                folder.imgs = folder.samples
                folder.targets = [t for _, t in folder.samples]
        if not train.samples:
            raise jc.JobError(f"{a.data}: none of its images could be read")
    if val is not None and val.classes != train.classes:
        raise jc.JobError(f"{a.val}: its class folders {val.classes} differ from the training "
                          f"folders {train.classes}")
    return train, val


class Updates:
    """The optimizer, plain (`step()` after backward) or fused (one optimizer
    per parameter, stepped from its post-accumulate-grad hook)."""

    def __init__(self, a, params):
        self.fused, self.params = a.fused, params
        make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=a.lr, momentum=0.9),
                "adam": lambda ps: torch.optim.Adam(ps, lr=a.lr),
                "adamw": lambda ps: torch.optim.AdamW(ps, lr=a.lr)}[a.optimizer]
        if a.optimizer_state == "bf16":
            raise jc.JobError("--optimizer-state bf16: PyTorch has no optimizer with bf16 state "
                              "for f32 parameters")
        if a.optimizer_state == "8bit":
            if a.out is not None or a.resume is not None:
                # bitsandbytes' state (blocks of 256, its own names) is not
                # a leangrad checkpoint's (blocks of 2048).
                raise jc.JobError("--optimizer-state 8bit: bitsandbytes' 8-bit state cannot be "
                                  "written or read as a leangrad checkpoint (--out, --resume)")
            try:
                import bitsandbytes as bnb
            except ImportError as e:
                raise jc.JobError("--optimizer-state 8bit needs bitsandbytes "
                                  "(pip install bitsandbytes)") from e
            make = {"sgd": lambda ps: bnb.optim.SGD8bit(ps, lr=a.lr, momentum=0.9),
                    "adam": lambda ps: bnb.optim.Adam8bit(ps, lr=a.lr),
                    "adamw": lambda ps: bnb.optim.AdamW8bit(ps, lr=a.lr)}[a.optimizer]
        self.kind = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}[a.optimizer]
        self.opts = [make([p]) for p in params] if a.fused else [make(params)]
        self.updates = 0
        if a.fused:
            for p, opt in zip(params, self.opts):
                p.register_post_accumulate_grad_hook(self.hook(opt))

    @staticmethod
    def hook(opt):
        def step_now(_param):
            opt.step()
            opt.zero_grad()
        return step_now

    def backward_step(self, loss):
        loss.backward()
        if not self.fused:
            self.opts[0].step()
            self.opts[0].zero_grad()
        self.updates += 1

    def owner(self, i):
        return self.opts[i] if self.fused else self.opts[0]

    def state_tensors(self):
        return [t for i, p in enumerate(self.params) for k, t in self.owner(i).state[p].items()
                if k in STATE_KEYS or k in BNB_STATE_KEYS]

    def save(self, folder, names, epoch, steps, model_name):
        tensors, state = {}, {}
        for i, p in enumerate(self.params):
            st = self.owner(i).state[p]
            for k in STATE_KEYS:
                if k in st and st[k] is not None:
                    tensors[f"state.{i}.{k}"] = st[k].detach().cpu().contiguous()
            step = st.get("step", self.updates)
            state[str(i)] = {"step": int(step)}
        group = {k: v for k, v in self.opts[0].param_groups[0].items()
                 if isinstance(v, (bool, int, float)) and k != "params"}
        if "betas" in self.opts[0].param_groups[0]:
            group["betas"] = list(self.opts[0].param_groups[0]["betas"])
            group["decoupled_weight_decay"] = self.kind == "AdamW"
        group["params"] = list(range(len(self.params)))
        group["param_names"] = names
        save_file(tensors, os.path.join(folder, "optimizer.safetensors"))
        manifest = {
            "format": "leangrad-checkpoint", "version": 1,
            "progress": {"epoch": epoch, "step": steps},
            "optimizer": {"kind": "SGD" if self.kind == "SGD" else "Adam", "param_groups": [group],
                          "state": state, "steps": self.updates},
            "schedule": None,
            "metadata": {"model": model_name, "written_by": f"torch {torch.__version__}"},
        }
        with open(os.path.join(folder, "checkpoint.json"), "w") as f:
            json.dump(manifest, f, indent=2)

    def load(self, folder):
        with open(os.path.join(folder, "checkpoint.json")) as f:
            manifest = json.load(f)
        saved_kind = manifest["optimizer"]["kind"]
        if saved_kind != ("SGD" if self.kind == "SGD" else "Adam"):
            raise jc.JobError(f"{folder}: a {saved_kind} checkpoint, not {self.kind}")
        tensors = load_file(os.path.join(folder, "optimizer.safetensors"))
        for i, p in enumerate(self.params):
            st = {k: tensors[f"state.{i}.{k}"].to(p.device) for k in STATE_KEYS
                  if f"state.{i}.{k}" in tensors}
            if self.kind != "SGD" and st:
                st["step"] = torch.tensor(float(manifest["optimizer"]["state"][str(i)]["step"]))
            if st:
                self.owner(i).state[p] = st
        self.updates = manifest["optimizer"]["steps"]
        return manifest["progress"]["epoch"] + 1


def run(a):
    if min(a.batch, a.size, a.epochs) < 1:
        raise jc.JobError("batch, size and epochs must be at least 1")
    if not (a.lr > 0 and a.lr != float("inf")):
        raise jc.JobError(f"the learning rate must be a positive number, not {a.lr}")
    if a.out is not None:
        jc.check_checkpoint_folder(a.out)
    device = jc.choose_device(a.device)
    train, val = datasets(a)
    model = jc.image_model(a.model, a.weights, len(train.classes), device, a.strict == "true",
                           a.strip_prefix, a.add_prefix)
    jc.apply_case(a.case, model)
    if a.checkpoint:
        checkpoint_blocks(model, a.model)
    if a.sync_batchnorm and torch.distributed.is_available() and torch.distributed.is_initialized():
        # As leangrad: only under a process group; a single process keeps its BatchNorm.
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise jc.JobError(f"case `{a.case}` trains no parameter of {a.model}")
    params = [p for _, p in named]
    updates = Updates(a, params)
    first = 0
    if a.resume is not None:
        model.load_state_dict(load_file(os.path.join(a.resume, "model.safetensors")), strict=True)
        first = updates.load(a.resume)
    meter = jc.StepMemory(device)
    batches = -(-len(train) // a.batch)
    # One loader for the run, its workers kept between epochs (as a PyTorch
    # user would); its generator is re-seeded from --seed and the epoch at
    # each epoch's start, which fixes that epoch's order.
    gen = torch.Generator()
    loader = torch.utils.data.DataLoader(train, batch_size=a.batch, shuffle=True,
                                         num_workers=a.workers, generator=gen,
                                         persistent_workers=a.workers > 0)
    epochs, written = [], None
    for epoch in range(first, a.epochs):
        gen.manual_seed(a.seed * 1_000_003 + epoch)
        epochs.append(train_epoch(model, loader, updates, meter, epoch, device, a.autocast))
        epochs[-1]["val_accuracy"] = validate(a, model, val, device)
        if a.out is not None:
            jc.check_checkpoint_folder(a.out)
            os.makedirs(a.out, exist_ok=True)
            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            save_file(state, os.path.join(a.out, "model.safetensors"))
            updates.save(a.out, [n for n, _ in named], epoch, (epoch + 1) * batches, a.model)
            written = a.out
    return {
        "model": a.model,
        "random_init": a.weights is None,
        "classes": train.classes,
        "case": a.case,
        "autocast": a.autocast,
        "trainable_parameters": sum(p.numel() for p in params),
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": jc.device_name(device),
        "first_epoch": first,
        "epochs": epochs,
        "memory": jc.memory_report(meter, device),
        "checkpoint": written,
    }


def train_epoch(model, loader, updates, meter, epoch, device, autocast=None):
    start = time.perf_counter()
    loss_sum, batches, right, seen = 0.0, 0, 0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        if meter.step_bytes is None:
            with meter.measure(model, [images, labels] + updates.state_tensors()):
                logits, loss = step(model, images, labels, updates, autocast)
        else:
            logits, loss = step(model, images, labels, updates, autocast)
        right += (logits.argmax(1) == labels).sum().item()
        seen += len(labels)
        loss_sum += loss
        batches += 1
    seconds = time.perf_counter() - start
    return {
        "epoch": epoch,
        "train_loss": loss_sum / max(batches, 1),
        "train_accuracy": right / max(seen, 1),
        "val_accuracy": None,
        "images_per_second": seen / max(seconds, 1e-9),
    }


def step(model, images, labels, updates, autocast=None):
    amp = {"bf16": torch.bfloat16, "f16": torch.float16}.get(autocast)
    with torch.autocast(device_type=images.device.type, dtype=amp, enabled=amp is not None):
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
    value = loss.item()
    updates.backward_step(loss)
    return logits.detach(), value


def validate(a, model, val, device):
    """Accuracy on the validation images, every layer in evaluation mode."""
    if val is None:
        return None
    training = model.training
    model.eval()
    right = seen = 0
    loader = torch.utils.data.DataLoader(val, batch_size=a.batch, num_workers=a.workers)
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            right += (model(images).argmax(1) == labels).sum().item()
            seen += len(labels)
    model.train(training)
    return right / max(seen, 1)


def describe(r):
    s = "note: no --weights given: the model starts from a random initialisation\n" if r["random_init"] else ""
    s += (f"{r['model']} on {r['device']}: {len(r['classes'])} classes, case {r['case']} trains "
          f"{r['trainable_parameters']} of {r['parameters']} parameters\n")
    for e in r["epochs"]:
        val = "" if e["val_accuracy"] is None else f"  val accuracy {100 * e['val_accuracy']:.1f}%"
        s += (f"epoch {e['epoch']:>3}  loss {e['train_loss']:.4f}  train accuracy "
              f"{100 * e['train_accuracy']:.1f}%{val}  {e['images_per_second']:.1f} images/s\n")
    s += jc.describe_memory(r["memory"], "training step")
    if r["checkpoint"]:
        s += f"checkpoint: {r['checkpoint']}\n"
    return s


def checkpoint_blocks(model, name):
    """Each residual block of a torchvision ResNet (each `features.N` of
    MobileNetV2) a non-reentrant checkpointed segment, as leangrad's
    `--checkpoint` (the blocks' own `forward` replaced, so the state_dict
    names stay torchvision's)."""
    from torch.utils.checkpoint import checkpoint

    if name == "mobilenet_v2":
        blocks = list(model.features)
    elif name.startswith(("resnet", "resnext")):
        blocks = [b for stage in (model.layer1, model.layer2, model.layer3, model.layer4)
                  for b in stage]
    else:
        raise jc.JobError(f"{name} has no per-block checkpointing")
    for block in blocks:
        block.forward = lambda x, f=block.forward: checkpoint(f, x, use_reentrant=False)


def main(argv=None):
    a = parse_args(argv)
    jc.set_threads_from_env()
    jc.main_guard(lambda: jc.emit(run(a), a.json, describe))


if __name__ == "__main__":
    main()
