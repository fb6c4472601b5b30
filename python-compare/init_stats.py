"""Statistics of the random initialisation of torchvision's and Hugging
Face's freshly built models, the reference of tests/models_init.rs.

leangrad draws from its own Philox stream, so its initial values cannot be
PyTorch's bit for bit; what must agree is the distribution of every
parameter. This script builds each model with torchvision's / transformers'
own constructors (torch seed 0) and writes, per parameter (leangrad's
state-dict name): its shape, mean, standard deviation (unbiased), the value
if every element is the same (else null) and, for 2-d tensors, the rows
that are entirely zero (an embedding's padding row).

Models (chosen so that leangrad builds the same layer shapes quickly in a
test; the VGGs keep torchvision's 25088 → 4096 → 4096 classifier here,
whose per-layer statistics do not depend on its width):

* resnet_basic: ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
* resnet_bottleneck_zero_init: ResNet(Bottleneck, [1, 1, 1, 1],
  num_classes=10, zero_init_residual=True)
* resnext_bottleneck: ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10,
  groups=32, width_per_group=4) (ResNeXt's grouped 3x3 convolutions)
* vgg11, vgg11_bn: torchvision's, num_classes=10
* mobilenet_v2: torchvision's, num_classes=10
* alexnet: torchvision's, num_classes=10 (PyTorch's default init)
* vit: ViTForImageClassification (hidden 96, 2 layers, 4 heads, MLP 384,
  64×64 images of 16×16 patches, 5 labels), names as the published
  checkpoints' (transformers 5's `layers.N.…` mapped back) without `vit.`
* bert: BertForSequenceClassification (vocabulary 1000, hidden 128,
  2 layers, 4 heads, MLP 512, 64 positions, 5 labels), without `bert.`
* gpt2: GPT2Model (vocabulary 1000, 64 positions, width 128, 4 layers,
  4 heads, MLP 512)

Needs torch, torchvision and transformers (pip install transformers).
Run from the repository root:

    python3 python-compare/init_stats.py            # writes the fixture
    python3 python-compare/init_stats.py --print    # prints a table only
"""

import argparse
import json
import os
import re
import sys

import torch
import torchvision
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

try:
    import transformers
    from transformers import (BertConfig, BertForSequenceClassification, GPT2Config,
                              GPT2Model, ViTConfig, ViTForImageClassification)
except ImportError as e:  # the reference is Hugging Face's own code
    raise SystemExit(f"needs transformers (pip install transformers): {e}")

OUT = os.path.join("tests", "fixtures", "init", "init_stats.json")

# transformers 5 ViT names -> the classic names leangrad uses.
VIT_RENAMES = [
    (r"^layers\.(\d+)\.attention\.q_proj\.", r"encoder.layer.\1.attention.attention.query."),
    (r"^layers\.(\d+)\.attention\.k_proj\.", r"encoder.layer.\1.attention.attention.key."),
    (r"^layers\.(\d+)\.attention\.v_proj\.", r"encoder.layer.\1.attention.attention.value."),
    (r"^layers\.(\d+)\.attention\.o_proj\.", r"encoder.layer.\1.attention.output.dense."),
    (r"^layers\.(\d+)\.mlp\.fc1\.", r"encoder.layer.\1.intermediate.dense."),
    (r"^layers\.(\d+)\.mlp\.fc2\.", r"encoder.layer.\1.output.dense."),
    (r"^layers\.(\d+)\.", r"encoder.layer.\1."),
]


def vit_name(n):
    n = n.removeprefix("vit.")
    for pat, rep in VIT_RENAMES:
        if re.match(pat, n):
            return re.sub(pat, rep, n)
    return n


def stats(t):
    """Shape, mean, unbiased std, constant value, all-zero rows of `t`."""
    t = t.detach().double()
    flat = t.flatten()
    first = flat[0].item()
    constant = first if bool((flat == first).all()) else None
    out = {
        "shape": list(t.shape),
        "mean": flat.mean().item(),
        "std": flat.std().item() if flat.numel() > 1 else 0.0,
        "constant": constant,
    }
    if t.dim() == 2 and constant is None:
        out["zero_rows"] = [int(i) for i in (t == 0).all(dim=1).nonzero().flatten()]
    return out


def models():
    """name -> (constructor description, model, rename)."""
    same = lambda n: n  # noqa: E731
    built = {}

    def add(name, what, make, rename=same):
        torch.manual_seed(0)
        built[name] = (what, make(), rename)

    add("resnet_basic", "ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)",
        lambda: ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10))
    add("resnet_bottleneck_zero_init",
        "ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, zero_init_residual=True)",
        lambda: ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, zero_init_residual=True))
    add("resnext_bottleneck",
        "ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, groups=32, width_per_group=4)",
        lambda: ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, groups=32,
                       width_per_group=4))
    add("vgg11", "torchvision.models.vgg11(num_classes=10)",
        lambda: torchvision.models.vgg11(num_classes=10))
    add("vgg11_bn", "torchvision.models.vgg11_bn(num_classes=10)",
        lambda: torchvision.models.vgg11_bn(num_classes=10))
    add("mobilenet_v2", "torchvision.models.mobilenet_v2(num_classes=10)",
        lambda: torchvision.models.mobilenet_v2(num_classes=10))
    add("alexnet", "torchvision.models.alexnet(num_classes=10)",
        lambda: torchvision.models.alexnet(num_classes=10))
    vit = ViTConfig(hidden_size=96, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=384, image_size=64, patch_size=16, num_labels=5)
    add("vit", "ViTForImageClassification(hidden 96, 2 layers, 4 heads, MLP 384, "
        "image 64, patch 16, 5 labels)", lambda: ViTForImageClassification(vit), vit_name)
    bert = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=512,
                      max_position_embeddings=64, type_vocab_size=2, num_labels=5)
    add("bert", "BertForSequenceClassification(vocabulary 1000, hidden 128, 2 layers, "
        "4 heads, MLP 512, 64 positions, 5 labels)",
        lambda: BertForSequenceClassification(bert), lambda n: n.removeprefix("bert."))
    gpt2 = GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=4, n_head=4,
                      n_inner=512, bos_token_id=0, eos_token_id=0)
    add("gpt2", "GPT2Model(vocabulary 1000, 64 positions, width 128, 4 layers, 4 heads, "
        "MLP 512)", lambda: GPT2Model(gpt2))
    return built


def dumps(result):
    """`result` as JSON with one line per parameter (small diffs)."""
    head = {k: v for k, v in result.items() if k != "models"}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(' "models": {')
    models = list(result["models"].items())
    for i, (name, m) in enumerate(models):
        lines.append(f"  {json.dumps(name)}: {{")
        lines.append(f"   \"built\": {json.dumps(m['built'])},")
        lines.append('   "params": {')
        params = list(m["params"].items())
        for j, (n, st) in enumerate(params):
            comma = "," if j + 1 < len(params) else ""
            lines.append(f"    {json.dumps(n)}: {json.dumps(st)}{comma}")
        lines.append("   }")
        lines.append("  }" + ("," if i + 1 < len(models) else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--print", action="store_true", help="print a table, write nothing")
    a = p.parse_args(argv)
    result = {
        "generator": "python-compare/init_stats.py",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "transformers": transformers.__version__,
        "models": {},
    }
    for name, (what, model, rename) in models().items():
        params = {rename(n): stats(t) for n, t in model.named_parameters()}
        result["models"][name] = {"built": what, "params": params}
        if a.print:
            print(f"== {name}: {what}")
            for n, s in params.items():
                c = "" if s["constant"] is None else f" constant {s['constant']:g}"
                z = f" zero rows {s['zero_rows']}" if s.get("zero_rows") else ""
                print(f"{n:55} {str(s['shape']):22} mean {s['mean']:+.2e} "
                      f"std {s['std']:.4e}{c}{z}")
    if not a.print:
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        with open(OUT, "w") as f:
            f.write(dumps(result))
        print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
