"""What python-compare/finetune.py, adversarial.py and style.py share: the
PyTorch side of src/jobs/mod.rs (choosing the device, building a
torchvision classifier by name with or without a safetensors weights file,
freezing by case, listing and reading images) and the memory measurement
behind each script's `memory` object.

The `memory` object of the three JSON reports has leangrad's field names
(src/jobs/mod.rs, `StepBytes`) with PyTorch's meanings, plus two fields of
PyTorch's own:

* `lean_step_bytes`: always null. leangrad's lean save policy has no
  PyTorch equivalent.
* `pytorch_step_bytes`: measured, not predicted: the peak bytes of tensors
  during the job's first step (leangrad predicts the same step under its
  save-all policy on its meta device). On the CPU: the bytes of the
  storages the step starts with (parameters, buffers, its input and
  targets) plus the peak of what the CPU allocator holds for the step,
  from the autograd profiler's allocation events (`profile_memory=True`). On CUDA:
  `torch.cuda.max_memory_allocated()` over the step.
* `measured_peak_bytes`: on CUDA `torch.cuda.max_memory_allocated()` over
  the whole run (leangrad: the ledger's peak over the whole run); null on
  the CPU, where PyTorch keeps no such count (see `peak_rss_bytes`).
* `saved_step_bytes` (PyTorch only): bytes of the distinct storages
  autograd saved for backward during that first step, parameters and
  buffers left out (`torch.autograd.graph.saved_tensors_hooks`), as
  python-compare/pytorch_saved_bytes.py counts them.
* `peak_rss_bytes` (PyTorch only): the process's peak resident set size,
  interpreter and libraries included (`getrusage`, Linux's kilobytes).

Threads: `RAYON_NUM_THREADS`, the variable that sets leangrad's thread
count, also sets `torch.set_num_threads` here, so one variable gives both
sides the same count.
"""

import json
import math
import os
import resource
import sys
from contextlib import contextmanager

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torchvision  # noqa: E402
import torchvision.transforms.functional as TF  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
# torchvision's IMG_EXTENSIONS, as leangrad's data::IMG_EXTENSIONS.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
CLASSIFIERS = ["resnet18", "resnet50", "resnet101", "resnext101_64x4d", "vgg16", "vgg16_bn",
               "vgg19", "vgg19_bn", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_v2_s",
               "efficientnet_v2_m", "efficientnet_v2_l", "alexnet", "convnext_tiny",
               "convnext_small", "convnext_base", "convnext_large"]
# The 14 names of leangrad's models::Case.
BASES = ["all", "input", "norm", "conv", "linear", "surgical-first", "surgical-last"]
CASES = BASES + [b + "-bn-eval" for b in BASES]
KINDS = {"conv": nn.Conv2d, "linear": nn.Linear,
         "norm": (nn.BatchNorm2d, nn.BatchNorm1d, nn.LayerNorm)}


class JobError(Exception):
    """Bad input, reported as `error: …` with exit status 1, as leangrad does."""


def set_threads_from_env():
    """torch's intra-op threads from RAYON_NUM_THREADS, when it is set."""
    n = os.environ.get("RAYON_NUM_THREADS")
    if n:
        torch.set_num_threads(int(n))


def choose_device(choice):
    """`auto` (CUDA 0 when there is one, else the CPU), `cpu` or `cuda`."""
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise JobError("device cuda: no CUDA device available")
        return torch.device("cuda", 0)
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def device_name(device):
    """leangrad's spelling: `cpu`, `cuda:0`."""
    return "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"


def head_name(name):
    """The classifier's last Linear, as leangrad's `ReplaceHead::head_name`."""
    if name.startswith(("resnet", "resnext")):
        return "fc"
    if name == "mobilenet_v3_large":
        return "classifier.3"
    if name.startswith("convnext"):
        return "classifier.2"
    if name == "mobilenet_v2" or name.startswith("efficientnet"):
        return "classifier.1"
    return "classifier.6"


def build_classifier(name, classes):
    """torchvision's `name` with `classes` outputs, randomly initialised
    (torch seed 0, as leangrad builds its models with seed 0)."""
    if name not in CLASSIFIERS:
        raise JobError(f"unknown model `{name}`; known: {', '.join(CLASSIFIERS)}")
    torch.manual_seed(0)
    return torchvision.models.get_model(name, weights=None, num_classes=classes)


def replace_head(model, name, classes):
    """`model.fc = nn.Linear(in, classes)` (or the classifier's last Linear)."""
    parent_name, _, leaf = head_name(name).rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, leaf)
    setattr(parent, leaf, nn.Linear(old.in_features, classes))


def read_state_dict(weights):
    """The tensors of a weights file: safetensors, or a PyTorch `.pt`/`.pth`
    (`torch.save` of a state dict, read with `weights_only=True`), as
    leangrad's io::load_weights."""
    if not os.path.isfile(weights):
        raise JobError(f"weights file `{weights}` not found")
    with open(weights, "rb") as f:
        zip_magic = f.read(4) == b"PK\x03\x04"
    try:
        if not zip_magic:
            return load_file(weights)
        tensors = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any reader error names the file
        raise JobError(f"{weights}: malformed weights: {e}") from e
    if isinstance(tensors, dict) and "state_dict" in tensors:
        tensors = tensors["state_dict"]
    if not isinstance(tensors, dict):
        raise JobError(f"{weights}: not a state dict")
    return {k: v for k, v in tensors.items() if torch.is_tensor(v)}


def rename_prefix(tensors, strip_prefix, add_prefix):
    """`strip_prefix` removed where present, then `add_prefix` put in front."""
    def rename(k):
        if strip_prefix and k.startswith(strip_prefix):
            k = k[len(strip_prefix):]
        return add_prefix + k
    return {rename(k): v for k, v in tensors.items()}


def image_model(name, weights, classes, device, strict=True, strip_prefix="", add_prefix=""):
    """As leangrad's jobs::image_model_with: with `weights` (safetensors or
    .pt/.pth of the torchvision model's state_dict, any class count, names
    renamed by the prefixes) loaded (`strict`: every name on both sides;
    else the names that line up, the others listed on stderr), the head
    replaced when its class count differs; without, random."""
    if weights is None:
        return build_classifier(name, classes).to(device)
    tensors = rename_prefix(read_state_dict(weights), strip_prefix, add_prefix)
    head = tensors.get(head_name(name) + ".weight")
    file_classes = classes if head is None else head.shape[0]
    model = build_classifier(name, file_classes)
    result = model.load_state_dict(tensors, strict=strict)
    if not strict:
        for kind, names in (("missing from the file (random init)", result.missing_keys),
                            ("in the file but not the model (ignored)", result.unexpected_keys)):
            if names:
                print(f"note: {len(names)} names {kind}: {', '.join(names[:8])}"
                      f"{' …' if len(names) > 8 else ''}", file=sys.stderr)
    if file_classes != classes:
        replace_head(model, name, classes)
    return model.to(device)


def readable_images(entries, skip_bad_images, path_of=lambda e: e[0]):
    """`entries` whose images open; with `skip_bad_images` one that does not
    is left out with a warning on stderr (as leangrad's --skip-bad-images),
    else the first ends the run with an error naming it."""
    kept = []
    for entry in entries:
        path = path_of(entry)
        try:
            with Image.open(path) as img:
                img.load()
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            if not skip_bad_images:
                raise JobError(f"{path}: {e}") from e
            print(f"warning: skipping unreadable image {path}: {e}", file=sys.stderr)
            continue
        kept.append(entry)
    return kept


def trainable(case, model):
    """Names of the parameters `case` trains, by leangrad's rule
    (models::Case::trainable, python-compare/export.py's `trainable`): by
    module type, or the first/last ceil(L/4) of the L parameterised layers."""
    base = case.removesuffix("-bn-eval")
    names = [n for n, _ in model.named_parameters()]
    if base == "all":
        return set(names)
    if base == "input":
        return set()
    if base in KINDS:
        mods = {n for n, m in model.named_modules() if isinstance(m, KINDS[base])}
        return {n for n in names if n.rsplit(".", 1)[0] in mods}
    layers = []
    for n in names:
        if n.rsplit(".", 1)[0] not in layers:
            layers.append(n.rsplit(".", 1)[0])
    q = math.ceil(len(layers) / 4)
    chosen = set(layers[:q] if base == "surgical-first" else layers[len(layers) - q:])
    return {n for n in names if n.rsplit(".", 1)[0] in chosen}


def apply_case(case, model):
    """Freezes by `case` and sets the mode (`-bn-eval`: evaluation mode)."""
    if case not in CASES:
        raise JobError(f"unknown case {case!r}; known: {', '.join(CASES)}")
    train = trainable(case, model)
    for n, p in model.named_parameters():
        p.requires_grad_(n in train)
    model.train(not case.endswith("-bn-eval"))


def is_image(name):
    return name.lower().endswith(IMG_EXTENSIONS)


def image_files(folder):
    """As leangrad's jobs::image_files: the image files of `folder`, sorted,
    directly in it (class None) or in its sub-folders (class = the name)."""
    if not os.path.isdir(folder):
        raise JobError(f"{folder}: not a folder")
    found = []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.isdir(path):
            found += [(os.path.join(path, f), entry) for f in sorted(os.listdir(path))
                      if os.path.isfile(os.path.join(path, f)) and is_image(f)]
        elif is_image(entry):
            found.append((path, None))
    if not found:
        raise JobError(f"{folder}: no image files (png, jpg, jpeg, bmp, …) in it or its sub-folders")
    return found


def read_image(path):
    """RGB `[3, H, W]` in [0, 1], as leangrad's data::read_image."""
    try:
        with Image.open(path) as img:
            return TF.to_tensor(img.convert("RGB"))
    except OSError as e:
        raise JobError(f"{path}: {e}") from e


def read_square(path, size):
    """As leangrad's jobs::read_square: shorter side resized to `size`
    (antialiased bilinear), then the centre crop."""
    return TF.center_crop(TF.resize(read_image(path), size, antialias=True), size)


def normalize(x):
    """ImageNet normalisation of `[N, 3, H, W]` in [0, 1]."""
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


# The PNG text chunk leangrad marks its images with (data::PNG_MARKER).
PNG_MARKER = ("Software", "leangrad")


def is_marked_png(path):
    """Whether `path` is a PNG carrying leangrad's marker."""
    try:
        with Image.open(path) as img:
            return img.format == "PNG" and img.text.get(PNG_MARKER[0]) == PNG_MARKER[1]
    except (OSError, ValueError):
        return False


def check_png_outputs(paths, option):
    """As leangrad's data::check_png_outputs: an existing file at any of
    `paths` must be one leangrad (or this twin) wrote; anything else is an
    error naming it, before any work, so nothing is overwritten."""
    for path in paths:
        if os.path.lexists(path) and not (os.path.isfile(path) and is_marked_png(path)):
            raise JobError(f"{option}: `{path}` exists and was not written by leangrad; "
                           "choose another output (nothing was overwritten)")


def write_png(image, path):
    """`[3, H, W]` or `[1, 3, H, W]` in [0, 1] as an 8-bit PNG, rounded as
    torchvision's save_image (and leangrad's write_png), with the marker."""
    from PIL.PngImagePlugin import PngInfo
    x = image.detach().cpu()
    if x.dim() == 4:
        x = x[0]
    pixels = x.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to(torch.uint8).numpy()
    info = PngInfo()
    info.add_text(*PNG_MARKER)
    Image.fromarray(pixels).save(path, pnginfo=info)


def check_checkpoint_folder(folder):
    """As leangrad's Checkpoint::save: the folder must be new, empty, or
    hold a leangrad checkpoint (its `checkpoint.json` manifest); anything
    else is an error naming it and nothing in it is touched."""
    if not os.path.lexists(folder):
        return
    if not os.path.isdir(folder):
        raise JobError(f"--out `{folder}` exists and is not a folder; nothing was written")
    if not os.listdir(folder):
        return
    try:
        with open(os.path.join(folder, "checkpoint.json")) as f:
            if json.load(f).get("format") == "leangrad-checkpoint":
                return
    except (OSError, ValueError, AttributeError):
        pass
    raise JobError(f"--out `{folder}` is not empty and holds no leangrad checkpoint; "
                   "choose a new or empty folder (nothing was written)")


def storage_key(t):
    return StorageWeakRef(t.untyped_storage()).cdata


def storages_bytes(tensors):
    """Bytes of the distinct storages of `tensors`."""
    seen = {}
    for t in tensors:
        if t is not None:
            seen[storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


class StepMemory:
    """Measures one step: `with meter.measure(model, live_tensors): step()`.

    `live_tensors` are the tensors the step starts with besides the model's
    parameters and buffers (its input, targets, optimizer state). Fills
    `saved_bytes` (what autograd saved) and `step_bytes` (the step's peak,
    what lives at its start included)."""

    def __init__(self, device):
        self.device = device
        self.saved_bytes = None
        self.step_bytes = None
        self.cuda_peak_before = 0  # the run's CUDA peak before the step's reset

    @contextmanager
    def measure(self, model, live_tensors):
        owned = list(model.parameters()) + list(model.buffers())
        owned_keys = {storage_key(t) for t in owned}
        saved = {}

        def pack(t):
            key = storage_key(t)
            if key not in owned_keys:
                saved[key] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
                self.cuda_peak_before = torch.cuda.max_memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                yield
                torch.cuda.synchronize()
                self.step_bytes = torch.cuda.max_memory_allocated()
            else:
                start = storages_bytes(owned + list(live_tensors))
                # The autograd profiler without Kineto: the same allocation
                # events, without Kineto's start-up (about 2 s on first use).
                with torch.autograd.profiler.profile(profile_memory=True, use_kineto=False) as prof:
                    yield
                self.step_bytes = start + allocation_peak(prof.kineto_results)
        self.saved_bytes = sum(saved.values())


def allocation_peak(results):
    """The peak of bytes allocated minus freed, in time order, over a
    profiled region (the CPU allocator's events only)."""
    from torch._C._profiler import _EventType

    events = []
    stack = list(results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak


def peak_rss_bytes():
    """This process's peak resident set size (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_report(meter, device):
    """The `memory` object: leangrad's fields with PyTorch's meanings (see
    the module docstring) and PyTorch's own two."""
    whole_run = None
    if device.type == "cuda":
        whole_run = max(meter.cuda_peak_before, torch.cuda.max_memory_allocated())
    return {
        "lean_step_bytes": None,
        "pytorch_step_bytes": meter.step_bytes,
        "measured_peak_bytes": whole_run,
        "saved_step_bytes": meter.saved_bytes,
        "peak_rss_bytes": peak_rss_bytes(),
    }


def describe_memory(memory, step):
    """One line for people, as leangrad's `StepBytes::describe`."""
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:.1f} MiB"  # noqa: E731
    return (f"memory of one {step}, parameters included: {mib(memory['pytorch_step_bytes'])} "
            f"(autograd saved {mib(memory['saved_step_bytes'])}); "
            f"peak RSS {mib(memory['peak_rss_bytes'])}\n")


def emit(report, as_json, describe):
    """The report as JSON only (as leangrad's `--json`), or described."""
    print(json.dumps(report, indent=2) if as_json else describe(report), end="\n" if as_json else "")


def main_guard(run):
    """Runs `run()`; a JobError is `error: …` on stderr and exit status 1."""
    try:
        run()
    except JobError as e:
        import sys

        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1)
