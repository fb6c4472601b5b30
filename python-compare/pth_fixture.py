"""Writes the PyTorch `.pth` fixtures of tests/io_pth.rs.

Every `<name>.pth` is written by `torch.save` itself (or, for the refused
and damaged files, laid out exactly as `torch.save` lays out its zip), and
every loadable one has `<name>.expected.safetensors` beside it: the same
tensors, contiguous, in the dtype leangrad loads them as (bool -> uint8,
int8/int16/int32 -> int64, uint16 -> uint32), so the test compares every
tensor bit for bit. Run from the repository root:

    python3 python-compare/pth_fixture.py

`--resnet18 DIR` instead writes, into DIR, a torchvision ResNet-18's state
dict as `resnet18.pth` (45 MB, random weights with random BatchNorm
statistics, seeded) and as `resnet18.safetensors`, and in `resnet18_io.safetensors`
an input batch and PyTorch's eval-mode logits for it (computed in f64 and
stored as f32). `LEANGRAD_PTH_RESNET18=DIR cargo test --test io_pth -- --ignored`
checks leangrad against them.
"""

import argparse
import collections
import io
import os
import pickle
import zipfile

import torch
from safetensors.torch import save_file

OUT = os.path.join("tests", "fixtures", "pth")

# Where the malicious pickles would write if anything ran them.
PWNED = "/tmp/leangrad-pth-pwned"


def tiny_model():
    """Conv + BatchNorm + Linear, with one training step so that the
    BatchNorm statistics and `num_batches_tracked` are not their defaults."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3),
        torch.nn.BatchNorm2d(3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(12, 4),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 2, 4, 4)).square().mean().backward()
    opt.step()
    return model


def expected(sd):
    """The tensors as leangrad loads them: contiguous, lossless dtypes."""
    widen = {
        torch.bool: torch.uint8,
        torch.int8: torch.int64,
        torch.int16: torch.int64,
        torch.int32: torch.int64,
        torch.uint16: torch.uint32,
    }
    return {k: v.detach().to(widen.get(v.dtype, v.dtype)).contiguous().clone() for k, v in sd.items()}


def save(name, obj, tensors=None):
    torch.save(obj, os.path.join(OUT, f"{name}.pth"))
    if tensors is not None:
        save_file(expected(tensors), os.path.join(OUT, f"{name}.expected.safetensors"))


def torch_zip(name, pickle_bytes, storages, top="archive", byteorder=b"little"):
    """A zip laid out as torch.save's: `top/data.pkl`, `top/byteorder`,
    `top/data/<key>`, `top/version`, entries stored."""
    with zipfile.ZipFile(os.path.join(OUT, name), "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{top}/data.pkl", pickle_bytes)
        if byteorder is not None:
            z.writestr(f"{top}/byteorder", byteorder)
        for key, data in storages.items():
            z.writestr(f"{top}/data/{key}", data)
        z.writestr(f"{top}/version", b"3\n")


class Storage:
    """Pickled as torch.save pickles a storage: a persistent id
    `('storage', storage_type, key, location, numel)`."""

    def __init__(self, storage_type, key, numel):
        self.pid = ("storage", storage_type, key, "cpu", numel)


class Rebuild:
    """Pickled as `torch._utils._rebuild_tensor_v2(storage, offset, size,
    stride, requires_grad, backward_hooks)`, with any arguments."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, Storage) else None


def crafted(obj):
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def f32_bytes(n):
    return torch.arange(n, dtype=torch.float32).numpy().tobytes()


def damaged():
    """Files whose tensors do not fit their storages."""
    hooks = collections.OrderedDict()
    s = Storage(torch.FloatStorage, "0", 4)
    cases = {
        # The pickle claims 1e15 elements; the entry holds 4.
        "huge_numel": Rebuild(Storage(torch.FloatStorage, "0", 10**15), 0, (10**15,), (1,), False, hooks),
        # Storage numel 8, entry holds 4 floats.
        "short_storage": Rebuild(Storage(torch.FloatStorage, "0", 8), 0, (8,), (1,), False, hooks),
        # The view runs past its storage's end (offset 2 + 3 elements > 4).
        "view_past_end": Rebuild(s, 2, (3,), (1,), False, hooks),
        # Strides reaching element 1 + 1*4 = 5 of 4.
        "stride_past_end": Rebuild(s, 0, (2, 2), (4, 1), False, hooks),
        # A negative stride (torch never writes one).
        "negative_stride": Rebuild(s, 3, (4,), (-1,), False, hooks),
        # A shape whose element count overflows 64 bits.
        "overflow_shape": Rebuild(s, 0, (2**40, 2**40), (0, 0), False, hooks),
    }
    for name, rebuild in cases.items():
        torch_zip(f"{name}.pth", crafted({"t": rebuild}), {"0": f32_bytes(4)})
    # A persistent id pointing at a storage entry the archive lacks.
    torch_zip("missing_storage.pth", crafted({"t": Rebuild(Storage(torch.FloatStorage, "7", 4), 0, (4,), (1,), False, hooks)}),
              {"0": f32_bytes(4)})
    # Big-endian data.
    torch_zip("big_endian.pth", crafted({"t": Rebuild(s, 0, (4,), (1,), False, hooks)}), {"0": f32_bytes(4)}, byteorder=b"big")
    # Another top folder name (torch takes it from the file name).
    torch_zip("other_top.pth", crafted({"t": Rebuild(s, 1, (3,), (1,), False, hooks)}), {"0": f32_bytes(4)}, top="weights_v2")
    save_file({"t": torch.arange(1, 4, dtype=torch.float32)}, os.path.join(OUT, "other_top.expected.safetensors"))


class Evil:
    """What an attacker pickles: `os.system(cmd)` called at load time."""

    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return (self.func, (self.arg,))


def malicious():
    """Pickles that would run code if loaded with `torch.load(weights_only=False)`:
    each would create a file under /tmp (the test checks that none appears)."""
    proto2_os = (
        b"\x80\x02}q\x00X\x01\x00\x00\x00xq\x01cos\nsystem\nq\x02X"
        + len(f"touch {PWNED}-os-system").to_bytes(4, "little")
        + f"touch {PWNED}-os-system".encode()
        + b"\x85R\x73."
    )
    torch_zip("evil_os_system.pth", proto2_os, {})
    # Protocol 4: STACK_GLOBAL builtins.eval(...).
    src = f"open('{PWNED}-eval', 'w').close()"
    body = (
        b"}\x94\x8c\x01x\x94"
        + b"\x8c\x08builtins\x94\x8c\x04eval\x94\x93\x94"
        + b"\x8c" + bytes([len(src)]) + src.encode() + b"\x94\x85\x94R\x94s."
    )
    stack_global = b"\x80\x04\x95" + len(body).to_bytes(8, "little") + body
    torch_zip("evil_builtins_eval.pth", stack_global, {})
    # What pickle itself writes for os.system on Linux (posix.system),
    # inside an otherwise valid state dict, after a real tensor.
    obj = collections.OrderedDict()
    obj["w"] = Rebuild(Storage(torch.FloatStorage, "0", 4), 0, (4,), (1,), False, collections.OrderedDict())
    obj["payload"] = Evil(os.system, f"touch {PWNED}-posix-system")
    torch_zip("evil_posix_system.pth", crafted(obj), {"0": f32_bytes(4)})


def loadable():
    model = tiny_model()
    sd = model.state_dict()  # an OrderedDict with `_metadata`, as torch.save writes it
    save("tiny_f32", sd, sd)
    for name, dtype in [("f16", torch.float16), ("bf16", torch.bfloat16), ("f64", torch.float64)]:
        m = tiny_model().to(dtype)
        save(f"tiny_{name}", m.state_dict(), m.state_dict())

    # Views: a transposed (non-contiguous) tensor, an offset row, a strided
    # slice and a broadcast (stride 0) all sharing their base's storage.
    torch.manual_seed(1)
    base = torch.randn(3, 4)
    vec = torch.randn(4)
    views = {
        "base": base,
        "transposed": base.t(),
        "row": base[1],
        "cols": base[:, 1:3],
        "broadcast": vec.expand(2, 4),
        "vec": vec,
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    save("views", views, views)

    # Integer and bool dtypes, widened losslessly; uint16/uint32 use
    # `_rebuild_tensor_v3` with an untyped storage.
    ints = {
        "bool": torch.tensor([True, False, True]),
        "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "int16": torch.tensor([-32768, 1, 32767], dtype=torch.int16),
        "int32": torch.tensor([-(2**31), 2, 2**31 - 1], dtype=torch.int32),
        "int64": torch.tensor([-(2**63), 3, 2**63 - 1], dtype=torch.int64),
        "uint8": torch.tensor([0, 128, 255], dtype=torch.uint8),
        "uint16": torch.tensor([0, 1, 65535], dtype=torch.uint16),
        "uint32": torch.tensor([0, 1, 2**32 - 1], dtype=torch.uint32),
        "uint32_t": torch.tensor([[1, 2], [3, 4]], dtype=torch.uint32).t(),
    }
    save("ints", ints, ints)
    save("complex", {"z": torch.tensor([1 + 2j, 3 - 4j])})
    save("uint64", {"big": torch.tensor([2**64 - 1], dtype=torch.uint64)})

    # nn.Parameters (`dict(model.named_parameters())`): `_rebuild_parameter`.
    params = dict(model.named_parameters())
    save("parameters", params, params)

    # A training checkpoint: the model's state dict one level down.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 2, 4, 4)).sum().backward()
    opt.step()
    ckpt = {"epoch": 3, "model": model.state_dict(), "optimizer": opt.state_dict(), "best": 0.5}
    save("checkpoint", ckpt, model.state_dict())
    save("two_state_dicts", {"model": model.state_dict(), "ema": model.state_dict(), "step": 10})
    save("list", [torch.zeros(2)])
    # Before PyTorch 1.6: a bare pickle, no zip.
    torch.save(sd, os.path.join(OUT, "legacy.pt"), _use_new_zipfile_serialization=False)
    # A whole pickled module (not a state dict) names its class.
    torch.save(torch.nn.Linear(2, 2), os.path.join(OUT, "whole_module.pth"))

    # TorchScript (code, not a state dict).
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), os.path.join(OUT, "torchscript.pt"))

    # The f32 state dict rezipped with deflate (as `zip -r` would do).
    with zipfile.ZipFile(os.path.join(OUT, "tiny_f32.pth")) as src, zipfile.ZipFile(
        os.path.join(OUT, "deflated.pth"), "w", zipfile.ZIP_DEFLATED
    ) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))


def resnet18(out_dir):
    import torchvision
    from safetensors.torch import save_file as save_st

    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.num_batches_tracked.fill_(7)
    model.eval()
    sd = model.state_dict()
    torch.save(sd, os.path.join(out_dir, "resnet18.pth"))
    save_st({k: v.contiguous() for k, v in sd.items()}, os.path.join(out_dir, "resnet18.safetensors"))
    x = torch.rand(2, 3, 224, 224)
    with torch.no_grad():
        logits = model.double()(x.double()).float()
    save_st({"input": x, "logits": logits}, os.path.join(out_dir, "resnet18_io.safetensors"))
    print(f"wrote {out_dir}/resnet18.pth, resnet18.safetensors, resnet18_io.safetensors")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resnet18", metavar="DIR", help="write the ResNet-18 files into DIR instead")
    args = parser.parse_args()
    if args.resnet18:
        resnet18(args.resnet18)
        return
    os.makedirs(OUT, exist_ok=True)
    loadable()
    damaged()
    malicious()
    print(f"wrote {len(os.listdir(OUT))} files in {OUT}")


if __name__ == "__main__":
    main()
