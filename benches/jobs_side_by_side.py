"""leangrad's three jobs next to their PyTorch twins, at real size.

Runs `leangrad finetune`, `leangrad adversarial` and `leangrad style` (the
release binary) and python-compare/finetune.py, adversarial.py and
style.py with the same arguments, the same inputs and the same thread
count (RAYON_NUM_THREADS, which the Python twins pass to
torch.set_num_threads), alternating which side runs first in each round so
a change of machine load hits both alike. Prints a table (each job's own
seconds, the process's wall seconds, memory: leangrad's ledger next to
what PyTorch measured, both processes' peak RSS) and each side's JSON
report; `--markdown FILE` writes it all down with the commands and the
machine.

Inputs, made deterministically under `--work` (default a new temporary
folder): an ImageFolder of 3 classes of 224×224 images (JPEG and PNG;
`--train-per-class`, default 32, and 8 per class for validation), 16
images in class-index folders for the attack, a content and a style PNG
of 256×256, and (unless `--no-weights`) a randomly initialised
torchvision ResNet-18 and VGG-19 `features` saved as safetensors, passed
to both sides with `--weights` so that they run the same network (without
it each side draws its own random init).

    python benches/jobs_side_by_side.py --threads 2 --markdown out.md

Peak RSS is each process's own (os.wait4), interpreter and libraries
included; for PyTorch's data-loading worker processes it is the largest
single process, not their sum. `--pytorch-env OMP_WAIT_POLICY=PASSIVE`
sets a variable for the PyTorch side only: on a machine whose cores are
also busy with other work, PyTorch's OpenMP threads spin-waiting for a
core can make a 2-thread step 2× slower (seen here), which this avoids.

Needs a Python with torch, torchvision, safetensors, numpy and PIL (run
the script with it; it runs the twins with the same interpreter), and
cargo, unless `--leangrad PATH` names a built binary.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWINS = os.path.join(ROOT, "python-compare")
CLASSES = ["daisy", "rose", "tulip"]
ATTACK_CLASSES = ["0", "1", "2"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="RAYON_NUM_THREADS for both sides")
    p.add_argument("--rounds", type=int, default=2, help="runs of each job on each side")
    p.add_argument("--only", default="finetune,adversarial,style", help="jobs to run, comma-separated")
    p.add_argument("--work", default=None, help="folder for the inputs and outputs")
    p.add_argument("--leangrad", default=None, help="the leangrad binary (default: cargo build --release)")
    p.add_argument("--train-per-class", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2, help="finetune epochs")
    p.add_argument("--attack-steps", type=int, default=10, help="adversarial PGD steps")
    p.add_argument("--style-steps", type=int, default=20, help="style L-BFGS steps")
    p.add_argument("--no-weights", action="store_true", help="random init on each side, no --weights")
    p.add_argument("--markdown", default=None, help="write the results as Markdown to this file")
    p.add_argument("--json-out", default=None, help="write every run's measurements and report")
    p.add_argument("--pytorch-env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for the PyTorch side only (e.g. OMP_WAIT_POLICY=PASSIVE)")
    p.add_argument("--make-inputs-only", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


# ---------------------------------------------------------------- inputs

def picture(h, w, seed, tint):
    """A smooth, seeded picture with a class tint, so classes are learnable."""
    import numpy as np

    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    f1, f2 = g.uniform(2, 9, size=2)
    base = np.stack([np.sin(f1 * yy + g.uniform(0, 6)), np.cos(f2 * xx + g.uniform(0, 6)),
                     np.sin(f1 * xx + f2 * yy)], axis=-1)
    img = 110 + 60 * base + np.asarray(tint) + g.normal(0, 12, size=(h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def make_inputs(work, a):
    from PIL import Image

    tints = [(50, -30, -30), (-30, 50, -30), (-30, -30, 50)]
    seed = 0

    def save(path, h, w, tint):
        nonlocal seed
        seed += 1
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(picture(h, w, seed, tint), "RGB").save(path, quality=92)

    for split, n in (("train", a.train_per_class), ("val", 8)):
        for c, (name, tint) in enumerate(zip(CLASSES, tints)):
            for i in range(n):
                ext = "jpg" if i % 2 == 0 else "png"
                save(os.path.join(work, split, name, f"{name}_{i:03}.{ext}"), 224, 224, tint)
    for c, tint in zip(ATTACK_CLASSES, tints):
        for i in range(16 // len(ATTACK_CLASSES) + (1 if c == "0" else 0)):
            save(os.path.join(work, "attack", c, f"img{c}_{i:02}.png"), 224, 224, tint)
    save(os.path.join(work, "content.png"), 256, 256, (0, 0, 0))
    save(os.path.join(work, "style.png"), 256, 256, (40, 0, -40))
    if a.no_weights:
        return
    import torch
    import torchvision
    from safetensors.torch import save_file

    sys.path.insert(0, TWINS)
    import style  # the twin's VGG features, torchvision's layout and init

    torch.manual_seed(0)
    r18 = torchvision.models.resnet18(weights=None)
    save_file({k: v.contiguous() for k, v in r18.state_dict().items()},
              os.path.join(work, "resnet18.safetensors"))
    torch.manual_seed(0)
    vgg = style.Features("E")
    save_file({k: v.contiguous() for k, v in vgg.state_dict().items()},
              os.path.join(work, "vgg19_features.safetensors"))


def job_args(job, work, side, a):
    """The job's arguments, the same for both sides but for output paths."""
    w = lambda name: os.path.join(work, name)  # noqa: E731
    weights = []
    if job == "finetune":
        weights = [] if a.no_weights else ["--weights", w("resnet18.safetensors")]
        return ["--model", "resnet18", *weights, "--data", w("train"), "--val", w("val"),
                "--case", "linear-bn-eval", "--epochs", str(a.epochs), "--batch", "32",
                "--size", "224", "--optimizer", "sgd", "--lr", "0.01", "--workers", "2",
                "--out", w(f"out-{side}/finetune-ckpt"), "--device", "cpu", "--json"]
    if job == "adversarial":
        weights = [] if a.no_weights else ["--weights", w("resnet18.safetensors")]
        return ["--model", "resnet18", *weights, "--images", w("attack"), "--attack", "pgd",
                "--steps", str(a.attack_steps), "--batch", "8", "--size", "224",
                "--out", w(f"out-{side}/adversarial"), "--device", "cpu", "--json"]
    weights = [] if a.no_weights else ["--weights", w("vgg19_features.safetensors")]
    return ["--content", w("content.png"), "--style", w("style.png"), *weights,
            "--model", "vgg19", "--size", "256", "--steps", str(a.style_steps),
            "--optimizer", "lbfgs", "--out", w(f"out-{side}/styled.png"), "--device", "cpu", "--json"]


# ---------------------------------------------------------------- running

def build_leangrad():
    cmd = ["cargo", "build", "--release", "--bin", "leangrad", "--message-format=json-render-diagnostics"]
    out = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
            if msg["target"]["name"] == "leangrad":
                return msg["executable"]
    raise SystemExit("cargo built no leangrad executable")


def make_inputs_in_child(work, a):
    """Makes the inputs in a child process: this process stays small (no
    numpy, PIL or torch), since a child starts with its parent's peak RSS
    as its own (Linux keeps the high-water mark across fork and exec)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--make-inputs-only", "--work", work,
           "--train-per-class", str(a.train_per_class)] + (["--no-weights"] if a.no_weights else [])
    subprocess.run(cmd, check=True)


def run_measured(cmd, threads, extra_env=()):
    """Runs `cmd`: its wall seconds, its own peak RSS (os.wait4's rusage, in
    bytes; for PyTorch's data-loading worker processes, the largest single
    process, not their sum) and its JSON report."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    env.update(kv.split("=", 1) for kv in extra_env)
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.read().decode()[-3000:]}")
        return {"wall_s": wall, "peak_rss_bytes": usage.ru_maxrss * 1024, "load_at_start": load,
                "report": json.loads(out.read())}


def job_seconds(job, report, train_images):
    """The job's own seconds: `seconds` of the report, or for fine-tuning
    the training time of its epochs (images / images per second)."""
    if job == "finetune":
        return sum(train_images / e["images_per_second"] for e in report["epochs"])
    return report["seconds"]


# ---------------------------------------------------------------- output

def mib(b):
    return "–" if b is None else f"{b / 2**20:.1f}"


def trimmed(report):
    """The report without its long lists (per-image results, loss history)."""
    r = dict(report)
    if "images" in r:
        r["images"] = f"[{len(r['images'])} per-image results]"
    if "history" in r:
        h = r["history"]
        r["history"] = f"[{len(h)} losses: first {h[0]:.6g}, last {h[-1]:.6g}]" if h else "[]"
    return r


def outcome(job, r):
    """What the job produced, to see both sides did the same work."""
    if job == "finetune":
        e = r["epochs"][-1]
        val = "–" if e["val_accuracy"] is None else f"{100 * e['val_accuracy']:.1f}%"
        return f"last epoch: loss {e['train_loss']:.4f}, train acc {100 * e['train_accuracy']:.1f}%, val acc {val}"
    if job == "adversarial":
        acc = lambda v: "–" if v is None else f"{100 * v:.0f}%"  # noqa: E731
        return (f"clean acc {acc(r['clean_accuracy'])} → adversarial {acc(r['adversarial_accuracy'])}, "
                f"success {100 * r['success_rate']:.0f}%, L∞ {r['linf_mean']:.4f}, L2 {r['l2_mean']:.3f}")
    lo = r["losses"]
    return f"final loss total {lo['total']:.4e} (content {lo['content']:.3e}, style {lo['style']:.3e})"


def table(results, jobs):
    rows = ["| job | leangrad s | PyTorch s | ratio | wall s leangrad / PyTorch | "
            "leangrad step MiB: lean / save-all (predicted) | PyTorch step MiB (measured) / autograd saved | "
            "leangrad ledger peak MiB | peak RSS MiB leangrad / PyTorch |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for job in jobs:
        L, P = results[job]["leangrad"], results[job]["pytorch"]
        ls = statistics.median(r["job_s"] for r in L)
        ps = statistics.median(r["job_s"] for r in P)
        lw = statistics.median(r["wall_s"] for r in L)
        pw = statistics.median(r["wall_s"] for r in P)
        lm, pm = L[-1]["report"]["memory"], P[-1]["report"]["memory"]
        lr = max(r["peak_rss_bytes"] for r in L)
        pr = max(r["peak_rss_bytes"] for r in P)
        rows.append(
            f"| {job} | {ls:.2f} | {ps:.2f} | {ls / ps:.2f} | {lw:.1f} / {pw:.1f} | "
            f"{mib(lm['lean_step_bytes'])} / {mib(lm['pytorch_step_bytes'])} | "
            f"{mib(pm['pytorch_step_bytes'])} / {mib(pm['saved_step_bytes'])} | "
            f"{mib(lm['measured_peak_bytes'])} | {mib(lr)} / {mib(pr)} |")
    return "\n".join(rows)


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    torch_version = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True).stdout.strip() or "not importable"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True).stdout.strip()
    return (f"{os.cpu_count()} logical cores ({model}), {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch_version}, leangrad commit {commit}")


def main():
    a = parse_args()
    if a.make_inputs_only:
        make_inputs(a.work, a)
        return
    jobs = [j for j in a.only.split(",") if j]
    work = a.work or tempfile.mkdtemp(prefix="leangrad-jobs-")
    os.makedirs(work, exist_ok=True)
    binary = a.leangrad or build_leangrad()
    print(f"inputs in {work}", file=sys.stderr)
    make_inputs_in_child(work, a)
    train_images = a.train_per_class * len(CLASSES)
    results = {j: {"leangrad": [], "pytorch": []} for j in jobs}
    commands = {}
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    for rnd in range(a.rounds):
        for job in jobs:
            sides = ["leangrad", "pytorch"] if rnd % 2 == 0 else ["pytorch", "leangrad"]
            for side in sides:
                args = job_args(job, work, side, a)
                cmd = ([binary, job] if side == "leangrad"
                       else [sys.executable, os.path.join(TWINS, f"{job}.py")]) + args
                commands[(job, side)] = cmd
                r = run_measured(cmd, a.threads, a.pytorch_env if side == "pytorch" else ())
                r["job_s"] = job_seconds(job, r["report"], train_images)
                results[job][side].append(r)
                print(f"round {rnd + 1} {job:<12} {side:<8} job {r['job_s']:7.2f} s  wall {r['wall_s']:7.2f} s"
                      f"  RSS {mib(r['peak_rss_bytes'])} MiB  (load {r['load_at_start']:.1f})", file=sys.stderr)
    load_after = os.getloadavg()
    text = render(a, jobs, results, commands, work, load_before, load_after, started)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({j: results[j] for j in jobs}, f, indent=1)


def render(a, jobs, results, commands, work, load_before, load_after, started):
    out = [table(results, jobs), ""]
    out.append("What each side produced (last round):\n")
    for job in jobs:
        for side in ("leangrad", "pytorch"):
            out.append(f"- {job}, {side}: {outcome(job, results[job][side][-1]['report'])}")
    out += ["", f"Machine: {machine()}.",
            f"Started {started}; load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load_before)} "
            f"before, {'/'.join(f'{x:.2f}' for x in load_after)} after; {a.rounds} rounds, "
            f"RAYON_NUM_THREADS={a.threads} for both sides"
            + "".join(f", {kv} for PyTorch" for kv in a.pytorch_env) + "; medians of the rounds.", "",
            "Commands (inputs made under the work folder, shown as `$W`):", "", "```sh"]
    for job in jobs:
        for side in ("leangrad", "pytorch"):
            cmd = [os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in commands[(job, side)]]
            cmd = [c.replace(work, "$W") for c in cmd]
            if side == "leangrad":
                cmd[0] = "cargo run --release --"
            else:
                cmd[0] = "python"
            env = "".join(f"{kv} " for kv in a.pytorch_env) if side == "pytorch" else ""
            out.append(f"RAYON_NUM_THREADS={a.threads} {env}" + " ".join(cmd))
    out += ["```", "", "Reports (last round; long lists shortened):", ""]
    for job in jobs:
        for side in ("leangrad", "pytorch"):
            out += [f"{job}, {side}:", "", "```json",
                    json.dumps(trimmed(results[job][side][-1]["report"]), indent=1)
                    .replace(work, "$W"), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
