"""`leangrad adversarial` in PyTorch: the same command-line options (names,
defaults, meanings), the same job and the same `--json` report, for side
by side runs (benches/jobs_side_by_side.py).

FGSM, PGD (L∞, random start) and PGD-L2 against a torchvision classifier
(`weights=None`, random init, unless `--weights W.safetensors`, a
state_dict loaded with `safetensors.torch.load_file` + `load_state_dict`,
the head replaced when `--classes` differs) with every parameter frozen
and every BatchNorm in evaluation mode (leangrad's `input-bn-eval` case).
Images as leangrad's `read_square`: PIL decode to RGB in [0, 1], shorter
side resized to `--size` (antialiased bilinear), centre crop; the ImageNet
normalisation inside the differentiated function, so `--eps`/`--alpha`
are in pixel units. Adversarial images are written to `--out` as 8-bit
PNGs under their file stems. Labels from class-index sub-folders
(`207/x.jpg`), else the clean prediction stands for the label; with
`--labels FILE` (one class name a line) each image's clean and
adversarial predictions are reported with their names, and always with
the model's confidence.

Report fields: those of leangrad's `AdversarialReport` with the same
meanings. What differs: PGD's random start comes from torch's generator
(seeded `--seed` + batch index), not leangrad's Philox stream, so the
perturbations differ draw by draw; and the `memory` object, whose fields
are explained in jobs_common.py (`lean_step_bytes` is always null: PyTorch
has no lean policy; on the CPU `measured_peak_bytes` is null and
`peak_rss_bytes` stands beside it; the step measured is the first
gradient of the first batch). Threads: RAYON_NUM_THREADS.

    RAYON_NUM_THREADS=2 python python-compare/adversarial.py --images DIR --out ADV --json
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobs_common as jc  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="adversarial.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="the model")
    p.add_argument("--weights", default=None,
                   help="safetensors or .pt/.pth file of the torchvision model's state_dict()")
    p.add_argument("--images", required=True, help="a folder of images, or of class-index sub-folders")
    p.add_argument("--attack", default="pgd", choices=["fgsm", "pgd", "pgd-l2"])
    p.add_argument("--eps", type=float, default=8.0 / 255.0, help="perturbation bound, pixel units")
    p.add_argument("--alpha", type=float, default=2.0 / 255.0, help="step of the iterative attacks")
    p.add_argument("--steps", type=int, default=10, help="steps of the iterative attacks")
    p.add_argument("--targeted", type=int, default=None, help="push every image towards this class")
    p.add_argument("--size", type=int, default=224, help="image size (shorter side, then centre crop)")
    p.add_argument("--batch", type=int, default=8, help="images attacked at once")
    p.add_argument("--classes", type=int, default=1000, help="the classifier's classes")
    p.add_argument("--labels", default=None,
                   help="a file of the classes' names, one a line in class-index order")
    p.add_argument("--seed", type=int, default=0, help="seed of PGD's random start")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--out", required=True, help="where the adversarial images are written")
    p.add_argument("--skip-bad-images", action="store_true",
                   help="leave out images that cannot be read, with a warning each")
    p.add_argument("--json", action="store_true", help="write only JSON to stdout")
    return p.parse_args(argv)


# The attacks' names in reports.
ATTACK_NAMES = {"fgsm": "FGSM", "pgd": "PGD", "pgd-l2": "PGD-L2"}


def read_labels(path, classes):
    """The class names of `path`, one a line (leangrad's read_labels)."""
    try:
        with open(path, encoding="utf-8") as f:
            names = [line.strip() for line in f.read().splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise jc.JobError(f"--labels {path}: {e}")
    if len(names) != classes:
        raise jc.JobError(f"--labels {path}: {len(names)} class names (one a line), but the "
                          f"classifier has {classes} classes (--classes); give one name per class, "
                          "in class-index order")
    if "" in names:
        raise jc.JobError(f"--labels {path}: line {names.index('') + 1} is empty: every class needs a name")
    return names


def check(a):
    if not (a.eps > 0 and a.eps != float("inf")):
        raise jc.JobError(f"eps must be a positive number, not {a.eps}")
    if a.attack != "fgsm" and not (a.alpha > 0 and a.alpha != float("inf")):
        raise jc.JobError(f"alpha must be a positive number, not {a.alpha}")
    if a.attack != "fgsm" and a.steps == 0:
        raise jc.JobError("steps must be at least 1")
    if min(a.batch, a.size, a.classes) < 1:
        raise jc.JobError("batch, size and classes must be at least 1")
    if a.targeted is not None and not 0 <= a.targeted < a.classes:
        raise jc.JobError(f"target class {a.targeted} is not below {a.classes}")


def predict(model, x):
    """The predicted classes and the model's probability (softmax) of each."""
    with torch.no_grad():
        p, c = model(jc.normalize(x)).softmax(1).max(1)
        return c.tolist(), p.tolist()


def input_gradient(model, x, targets):
    """The gradient of the mean cross-entropy with respect to the images."""
    x = x.detach().requires_grad_(True)
    loss = F.cross_entropy(model(jc.normalize(x)), targets)
    (grad,) = torch.autograd.grad(loss, x)
    return grad, loss.detach()


def per_image_l2(t):
    return t.square().sum(dim=(1, 2, 3), keepdim=True).sqrt()


def attack(model, x, targets, a, seed, gradient):
    """The adversarial images for `x`, as leangrad's jobs::adversarial::attack."""
    direction = -1.0 if a.targeted is not None else 1.0
    eps, alpha = a.eps, a.alpha
    if a.attack == "fgsm":
        g, _ = gradient(model, x, targets)
        return (x + direction * eps * g.sign()).clamp(0, 1)
    if a.attack == "pgd":
        gen = torch.Generator(device=x.device).manual_seed(seed)
        noise = torch.empty_like(x).uniform_(-eps, eps, generator=gen)
        adv = (x + noise).clamp(0, 1)
    else:
        adv = x.clone()
    for _ in range(a.steps):
        g, _ = gradient(model, adv, targets)
        with torch.no_grad():
            if a.attack == "pgd-l2":
                step = g / (per_image_l2(g) + 1e-12)
                delta = adv + direction * alpha * step - x
                factor = (eps / (per_image_l2(delta) + 1e-12)).clamp(0, 1)
                delta = delta * factor
            else:
                delta = (adv + direction * alpha * g.sign() - x).clamp(-eps, eps)
            adv = (x + delta).clamp(0, 1)
    return adv


def written_path(out, path, cls):
    """Where the adversarial image of `path` goes: `out/<stem>.png`, or
    `out/<class>/<stem>.png` for a class sub-folder's image, as leangrad's."""
    stem = os.path.splitext(os.path.basename(path))[0]
    folder = out if cls is None else os.path.join(out, cls)
    return os.path.join(folder, f"{stem}.png")


def run(a):
    check(a)
    names = read_labels(a.labels, a.classes) if a.labels is not None else None
    device = jc.choose_device(a.device)
    files = jc.readable_images(jc.image_files(a.images), a.skip_bad_images)
    if not files:
        raise jc.JobError(f"{a.images}: none of its image files could be read")
    jc.check_png_outputs([written_path(a.out, p, c) for p, c in files], "--out")
    os.makedirs(a.out, exist_ok=True)
    meter = jc.StepMemory(device)
    measured = [False]

    def gradient(model, x, targets):
        if measured[0]:
            return input_gradient(model, x, targets)
        measured[0] = True
        with meter.measure(model, [x, targets]):
            return input_gradient(model, x, targets)

    start = time.perf_counter()
    model = jc.image_model(a.model, a.weights, a.classes, device)
    jc.apply_case("input-bn-eval", model)
    results = []
    for b, first in enumerate(range(0, len(files), a.batch)):
        chunk = files[first:first + a.batch]
        x = torch.stack([jc.read_square(p, a.size) for p, _ in chunk]).to(device)
        labels = []
        for _, cls in chunk:
            label = int(cls) if cls is not None and cls.isdigit() else None
            labels.append(label if label is not None and label < a.classes else None)
        clean, clean_p = predict(model, x)
        reference = [c if l is None else l for l, c in zip(labels, clean)]
        goal = reference if a.targeted is None else [a.targeted] * len(chunk)
        targets = torch.tensor(goal, dtype=torch.long, device=device)
        adv = attack(model, x, targets, a, a.seed + b, gradient)
        adversarial, adversarial_p = predict(model, adv)
        delta = adv - x
        linf = delta.abs().flatten(1).max(1).values.tolist()
        l2 = delta.square().sum(dim=(1, 2, 3)).sqrt().tolist()
        for i, (path, cls) in enumerate(chunk):
            written = written_path(a.out, path, cls)
            os.makedirs(os.path.dirname(written) or ".", exist_ok=True)
            jc.write_png(adv[i], written)
            results.append({"file": path, "written": written, "label": labels[i],
                            "clean": clean[i], "clean_confidence": clean_p[i],
                            "clean_name": names[clean[i]] if names else None,
                            "adversarial": adversarial[i],
                            "adversarial_confidence": adversarial_p[i],
                            "adversarial_name": names[adversarial[i]] if names else None,
                            "linf": linf[i], "l2": l2[i]})
    seconds = time.perf_counter() - start
    return summarise(a, results, jc.memory_report(meter, device), seconds, device)


def summarise(a, images, memory, seconds, device):
    n = max(len(images), 1)
    labelled = [r for r in images if r["label"] is not None]

    def accuracy(key):
        if not labelled:
            return None
        return sum(r[key] == r["label"] for r in labelled) / len(labelled)

    if a.targeted is not None:
        success = sum(r["adversarial"] == a.targeted for r in images) / n
    else:
        success = sum(r["adversarial"] != (r["clean"] if r["label"] is None else r["label"])
                      for r in images) / n
    return {
        "model": a.model,
        "random_init": a.weights is None,
        "attack": ATTACK_NAMES[a.attack],
        "eps": a.eps,
        "alpha": a.alpha,
        "steps": 1 if a.attack == "fgsm" else a.steps,
        "targeted": a.targeted,
        "device": jc.device_name(device),
        "images_folder": a.images,
        "clean_accuracy": accuracy("clean"),
        "adversarial_accuracy": accuracy("adversarial"),
        "success_rate": success,
        "linf_mean": sum(r["linf"] for r in images) / n,
        "linf_max": max([r["linf"] for r in images] + [0.0]),
        "l2_mean": sum(r["l2"] for r in images) / n,
        "memory": memory,
        "seconds": seconds,
        "images": images,
    }


def describe(r):
    pct = lambda v: "n/a (no labels)" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    s = "note: no --weights given: the model is randomly initialised\n" if r["random_init"] else ""
    target = "" if r["targeted"] is None else f" targeted at class {r['targeted']}"
    s += (f"{r['model']} on {r['device']} ({len(r['images'])} images, {r['seconds']:.1f} s): "
          f"{r['attack']} eps {r['eps']:.4f} alpha {r['alpha']:.4f} steps {r['steps']}{target}\n")
    s += (f"clean accuracy {pct(r['clean_accuracy'])}  adversarial accuracy "
          f"{pct(r['adversarial_accuracy'])}  success rate {100 * r['success_rate']:.1f}%\n")
    s += (f"perturbation: L∞ mean {r['linf_mean']:.4f} max {r['linf_max']:.4f}, "
          f"L2 mean {r['l2_mean']:.4f}\n")
    s += jc.describe_memory(r["memory"], "attack step")
    s += "per image: file: clean prediction → adversarial prediction (the model's confidence)\n"

    def cls(c, name, p):
        return f"{c} {name} ({100 * p:.1f}%)" if name is not None else f"class {c} ({100 * p:.1f}%)"

    for i in r["images"]:
        label = "" if i["label"] is None else f" (label {i['label']})"
        s += (f"  {os.path.relpath(i['file'], r['images_folder'])}{label}: "
              f"{cls(i['clean'], i['clean_name'], i['clean_confidence'])} → "
              f"{cls(i['adversarial'], i['adversarial_name'], i['adversarial_confidence'])}\n")
    return s


def main(argv=None):
    a = parse_args(argv)
    jc.set_threads_from_env()
    jc.main_guard(lambda: jc.emit(run(a), a.json, describe))


if __name__ == "__main__":
    main()
