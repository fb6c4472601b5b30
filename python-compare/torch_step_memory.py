"""What PyTorch itself keeps in one training step: the third column of
`leangrad memory --compare-torch`.

Builds the model `leangrad memory` builds, as PyTorch users build it
(torchvision's resnet18, resnet50, resnet101, resnext101_64x4d, vgg16,
vgg16_bn, mobilenet_v2, mobilenet_v3_large, efficientnet_v2_s/_m/_l, alexnet,
convnext_*; Hugging Face's
ViTForImageClassification, BertForSequenceClassification,
RobertaForSequenceClassification, XLMRobertaForSequenceClassification
(roberta-base's and xlm-roberta-base's sizes), GPT2LMHeadModel and
MistralForCausalLM (Mistral-7B v0.1's configuration) at their
default, full-size configurations, dropout 0 for the text models as
leangrad's twins), randomly initialised (nothing is
downloaded), freezes it by leangrad's case rule (models::Case: by layer
type, or the first/last ceil(L/4) of the L parameterised layers in
leangrad's parameter order, `-bn-eval` for evaluation mode), and runs one
step as leangrad's memory planner does: input (images, token ids, or for
the `input` cases the input embeddings requiring grad), forward, mean
cross-entropy over the logits (GPT-2: next-token targets, given already
shifted, over every position), backward and the optimizer step (SGD with
momentum 0.9, Adam, AdamW with PyTorch's defaults; `--fused`: one
optimizer per parameter stepped in a post-accumulate-grad hook, PyTorch's
"optimizer step in backward"); `--checkpoint`: activation checkpointing
per block, non-reentrant (`torch.utils.checkpoint(..., use_reentrant=False)`
around each torchvision residual block, each of the MobileNets'
`features.N`, each of EfficientNet's blocks `features.N.M` (and its
stem and last convolution) and each ConvNeXt block; Hugging Face's
`gradient_checkpointing_enable` with `use_reentrant: False`).

It measures:

* `saved_bytes`: the bytes of the distinct storages autograd saves for
  backward during forward and loss (`saved_tensors_hooks`), the model's
  parameters and buffers left out (with `--checkpoint`, a segment's inputs
  are held by the checkpoint itself, not saved through the hooks: only the
  step's peak counts them). Nothing saved is freed before backward,
  so this is the saved-for-backward peak. Measured on every device.
* `step_peak_bytes`: the step's peak, parameters included. On CUDA
  `torch.cuda.max_memory_allocated()` from before the model is built to
  the end of the optimizer step; on the CPU the bytes of the storages the
  step starts with (parameters, buffers, input, targets) plus the peak of
  the CPU allocator's events during the step (the autograd profiler's
  `profile_memory`, as jobs_common.py measures the jobs); null on `meta`,
  where nothing is allocated (`step_peak_method` says which): `leangrad
  memory --compare-torch cpu` runs this script with `--device cpu` at a
  small batch (`--torch-batch`, default 2) for that number.

Usage (one JSON object on stdout; `--case` may be repeated, or
`--all-cases` given, then one object per line, one per case; with
`--all-cases` a case that trains nothing in the model, such as `norm` in
VGG-16, is left out, as leangrad refuses it):

    python3 python-compare/torch_step_memory.py --model resnet18 --batch 64 \
        --case input-bn-eval [--size 224] [--classes 1000] [--seq 128] \
        [--dtype f32|f16|bf16] [--optimizer sgd|adam|adamw] [--fused] [--checkpoint] \
        [--optimizer-state f32|bf16|8bit] [--autocast bf16|f16] [--device meta|cpu|cuda] \
        [--attention sdpa|eager]

`--autocast` runs the forward and the loss under `torch.autocast` on the
step's device (CPU or CUDA; PyTorch's autocast does not run on the meta
device, answered as unsupported).

`--optimizer-state 8bit` uses bitsandbytes' 8-bit optimizers (`Adam8bit`,
`AdamW8bit`, `SGD8bit`; block-wise state, f32 under 4096 elements); `bf16`
has no PyTorch counterpart and is answered as unsupported (exit 3 with
`{"missing": [], "unsupported": why}`).

The object: `model`, `source` (the PyTorch class), `versions` (torch,
torchvision, transformers), the step as run (`batch`, `size` or null,
`seq` or null, `classes`, `dtype`, `optimizer`, `fused`, `checkpoint`,
`optimizer_state`, `case`,
`device`, `attention`: the Hugging Face attention implementation, null
for the CNNs), `trainable_parameters` (elements requiring grad), `parameter_bytes`
(the model's parameters and buffers), `optimizer_state_bytes` (the
optimizer's state tensors on the step's device after the step; null on
`meta`, where the optimizer does not run), `saved_bytes`, `saved_storages`, `step_peak_bytes`, `step_peak_method`
and `seconds`.

When a module the model needs is not importable the script prints
`{"missing": [...], "install": "pip install ..."}` and exits with status
3 (leangrad shows the install line and its own table). Needs `torch`,
plus `torchvision` for the CNNs or `transformers` for the others; it
imports nothing else beyond the standard library, so leangrad can run it
from anywhere (the binary carries a copy of this file).

tests/fixtures/torch_step_memory.jsonl is its output on the meta device
for every model at batch 2 (224x224 images, 128 tokens), every case:

    for m in resnet18 resnet50 vgg16 vgg16_bn mobilenet_v2 vit_b16 bert_base gpt2 \
             resnet101 resnext101_64x4d alexnet; do
        python3 python-compare/torch_step_memory.py --model $m --batch 2 --all-cases
    done > tests/fixtures/torch_step_memory.jsonl

tests/pytorch_saved_bytes.rs compares it with leangrad's save-all policy
(what leangrad predicts PyTorch keeps) and lean policy.
"""

import argparse
import contextlib
import importlib.util
import json
import math
import re
import sys
import time

CNNS = ["resnet18", "resnet50", "resnet101", "resnext101_64x4d", "vgg16", "vgg16_bn",
        "mobilenet_v2", "mobilenet_v3_large", "efficientnet_v2_s", "efficientnet_v2_m",
        "efficientnet_v2_l", "alexnet", "convnext_tiny", "convnext_small", "convnext_base",
        "convnext_large"]
HF = ["vit_b16", "bert_base", "roberta_base", "xlm_roberta_base", "gpt2", "mistral_7b"]
# The language models: next-token targets over their vocabulary.
LMS = ["gpt2", "mistral_7b"]
ROBERTAS = ["roberta_base", "xlm_roberta_base"]
BASES = ["all", "input", "norm", "conv", "linear", "surgical-first", "surgical-last"]
CASES = BASES + [b + "-bn-eval" for b in BASES]
EXIT_MISSING = 3

# transformers 5 spells ViT's modules differently from the published
# checkpoints and from leangrad (`layers.N.attention.q_proj`); leangrad's
# names are the classic ones.
VIT_RENAMES = [
    (r"^layers\.(\d+)\.attention\.q_proj\.", r"encoder.layer.\1.attention.attention.query."),
    (r"^layers\.(\d+)\.attention\.k_proj\.", r"encoder.layer.\1.attention.attention.key."),
    (r"^layers\.(\d+)\.attention\.v_proj\.", r"encoder.layer.\1.attention.attention.value."),
    (r"^layers\.(\d+)\.attention\.o_proj\.", r"encoder.layer.\1.attention.output.dense."),
    (r"^layers\.(\d+)\.mlp\.fc1\.", r"encoder.layer.\1.intermediate.dense."),
    (r"^layers\.(\d+)\.mlp\.fc2\.", r"encoder.layer.\1.output.dense."),
    (r"^layers\.(\d+)\.", r"encoder.layer.\1."),
]
# leangrad's order of a ViT layer's parameters.
VIT_LAYER_ORDER = ["attention.attention.query", "attention.attention.key",
                   "attention.attention.value", "attention.output.dense",
                   "intermediate.dense", "output.dense", "layernorm_before",
                   "layernorm_after"]


def needed_modules(args):
    out = ["torch", "torchvision" if args.model in CNNS else "transformers"]
    if args.optimizer_state == "8bit":
        out.append("bitsandbytes")  # its 8-bit optimizers are PyTorch's
    return out


def leangrad_name(model, name):
    """The name leangrad gives the parameter Hugging Face calls `name`
    (torchvision's names are leangrad's)."""
    for prefix in ("vit.", "bert.", "roberta.", "transformer."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if model in ROBERTAS:
        # RobertaClassificationHead's dense + tanh + out_proj on the first
        # token are leangrad's pooler and classifier.
        for theirs, ours in (("classifier.dense.", "pooler.dense."),
                             ("classifier.out_proj.", "classifier.")):
            if name.startswith(theirs):
                return ours + name[len(theirs):]
    if model == "vit_b16":
        for pat, rep in VIT_RENAMES:
            if re.match(pat, name):
                return re.sub(pat, rep, name)
    return name


def leangrad_rank(model, name):
    """Sort key putting parameters in leangrad's order (only ViT's differs
    from PyTorch's: embeddings, then each layer as VIT_LAYER_ORDER, then
    the final LayerNorm and the classifier)."""
    if model != "vit_b16":
        return (0, 0, 0)
    m = re.match(r"^encoder\.layer\.(\d+)\.(.*)\.(weight|bias)$", name)
    if m is None:
        return (0, 0, 0) if name.startswith("embeddings.") else (2, 0, 0)
    return (1, int(m.group(1)), VIT_LAYER_ORDER.index(m.group(2)))


def parameter_kinds(torch, model_name, model):
    """(leangrad name, parameter, kind) in leangrad's order; kind is
    `conv`, `linear`, `norm` or `other`, as leangrad's LayerKind."""
    from torch import nn

    linear = [nn.Linear]
    if model_name in HF:
        from transformers.pytorch_utils import Conv1D  # GPT-2's Linear

        linear.append(Conv1D)
    kind_of = {}
    for mname, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            kind = "conv"
        elif isinstance(m, tuple(linear)):
            kind = "linear"
        elif isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
            kind = "norm"
        else:
            kind = "other"
        for pname, _ in m.named_parameters(recurse=False):
            kind_of[f"{mname}.{pname}" if mname else pname] = kind
    rows = [(leangrad_name(model_name, n), p, kind_of[n]) for n, p in model.named_parameters()]
    rows.sort(key=lambda r: leangrad_rank(model_name, r[0]))  # stable
    return rows


def trainable(case, rows):
    """Names of the parameters `case` trains (leangrad's Case::trainable)."""
    base = case.removesuffix("-bn-eval")
    names = [n for n, _, _ in rows]
    if base == "all":
        return set(names)
    if base == "input":
        return set()
    if base in ("conv", "linear", "norm"):
        return {n for n, _, k in rows if k == base}
    layers = []
    for n in names:
        if n.rsplit(".", 1)[0] not in layers:
            layers.append(n.rsplit(".", 1)[0])
    q = math.ceil(len(layers) / 4)
    chosen = set(layers[:q] if base == "surgical-first" else layers[len(layers) - q:])
    return {n for n in names if n.rsplit(".", 1)[0] in chosen}


def build(torch, args):
    """The model (on the current default device) and its PyTorch class."""
    torch.manual_seed(0)
    if args.model in CNNS:
        import torchvision

        model = torchvision.models.get_model(args.model, weights=None, num_classes=args.classes)
        return model, f"torchvision.models.{args.model}"
    import transformers as tf

    # Dropout 0, as leangrad's twins (ViT's default already is).
    attn = dict(attn_implementation=args.attention)
    if args.model == "vit_b16":
        cfg = tf.ViTConfig(image_size=args.size, num_labels=args.classes, **attn)
        cls = tf.ViTForImageClassification
    elif args.model == "bert_base":
        cfg = tf.BertConfig(num_labels=args.classes, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, **attn)
        cls = tf.BertForSequenceClassification
    elif args.model in ROBERTAS:
        xlm = args.model == "xlm_roberta_base"
        config_cls = tf.XLMRobertaConfig if xlm else tf.RobertaConfig
        cfg = config_cls(vocab_size=250002 if xlm else 50265, max_position_embeddings=514,
                         type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
                         num_labels=args.classes, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, classifier_dropout=0.0, **attn)
        cls = (tf.XLMRobertaForSequenceClassification if xlm
               else tf.RobertaForSequenceClassification)
    elif args.model == "mistral_7b":
        # Mistral-7B v0.1's config.json (MistralConfig's defaults but for
        # these two).
        cfg = tf.MistralConfig(rms_norm_eps=1e-5, max_position_embeddings=32768,
                               attention_dropout=0.0, **attn)
        cls = tf.MistralForCausalLM
    else:
        cfg = tf.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **attn)
        cls = tf.GPT2LMHeadModel
    cfg._attn_implementation = args.attention  # older transformers ignore the keyword
    return cls(cfg), f"transformers.{cls.__name__}"


def checkpoint_blocks(torch, args, model):
    """Each residual block (CNNs) or encoder layer / block (transformers) a
    non-reentrant checkpointed segment, as leangrad's `--checkpoint`."""
    if args.model in ("mobilenet_v2", "mobilenet_v3_large") or args.model.startswith("efficientnet"):
        # Every `features.N` block, as leangrad's MobileNets; EfficientNet's
        # stages are Sequentials of blocks, each block its own segment.
        from torch.utils.checkpoint import checkpoint

        blocks = list(model.features)
        if args.model.startswith("efficientnet"):
            blocks = [blocks[0]] + [b for stage in blocks[1:-1] for b in stage] + [blocks[-1]]
        for block in blocks:
            block.forward = lambda x, f=block.forward: checkpoint(f, x, use_reentrant=False)
        return
    if args.model.startswith("convnext"):
        # Every ConvNeXt block (CNBlock), as leangrad's ConvNeXt.
        from torch.utils.checkpoint import checkpoint
        from torchvision.models.convnext import CNBlock

        for m in model.modules():
            if isinstance(m, CNBlock):
                m.forward = lambda x, f=m.forward: checkpoint(f, x, use_reentrant=False)
        return
    if args.model not in ("resnet18", "resnet50", "resnet101", "resnext101_64x4d"):
        if args.model in CNNS:
            raise SystemExit(f"{args.model} has no per-block checkpointing")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    from torch.utils.checkpoint import checkpoint

    class Segment(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
        for i in range(len(stage)):
            stage[i] = Segment(stage[i])


def make_input(torch, args, model, dtype, device):
    """The step's input and targets, as leangrad's StepInput makes them."""
    n, grad = args.batch, args.case.startswith("input")
    if args.model in CNNS or args.model == "vit_b16":
        x = torch.randn(n, 3, args.size, args.size, dtype=dtype, device=device)
        return x.requires_grad_(grad), torch.arange(n, device=device) % args.classes
    cfg = model.config
    if grad:
        x = torch.randn(n, args.seq, cfg.hidden_size, dtype=dtype, device=device)
        x.requires_grad_(True)
    else:
        x = (torch.arange(n * args.seq, device=device) % cfg.vocab_size).view(n, args.seq)
    if args.model in LMS:
        targets = (torch.arange(n * args.seq, device=device) + 1) % cfg.vocab_size
    else:
        targets = torch.arange(n, device=device) % args.classes
    return x, targets


def logits(args, model, x):
    """The logits the loss reads: `[rows, classes]`."""
    if args.model in CNNS:
        return model(x)
    if args.model == "vit_b16":
        return model(pixel_values=x).logits
    kw = {"inputs_embeds": x} if x.is_floating_point() else {"input_ids": x}
    out = model(**kw).logits
    return out.reshape(-1, out.shape[-1])


def optimizer(torch, args, params):
    if args.optimizer_state == "8bit":
        # bitsandbytes' block-wise 8-bit state, what a PyTorch user turns on
        # (parameters under 4096 elements keep f32 state, as leangrad's).
        import bitsandbytes as bnb

        if args.optimizer == "sgd":
            return bnb.optim.SGD8bit(params, lr=0.01, momentum=0.9)
        if args.optimizer == "adam":
            return bnb.optim.Adam8bit(params, lr=1e-3)
        return bnb.optim.AdamW8bit(params, lr=1e-3)
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.AdamW(params, lr=1e-3)


def storage_key(t):
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(t.untyped_storage()).cdata


def storages_bytes(tensors):
    """Bytes of the distinct storages of `tensors`."""
    return sum({storage_key(t): t.untyped_storage().nbytes() for t in tensors}.values())


def allocation_peak(results):
    """The peak of CPU bytes allocated minus freed, in time order, over a
    profiled region (as jobs_common.py)."""
    from torch._C._profiler import _EventType

    events, stack = [], list(results.experimental_event_tree())
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


def measure(torch, args, case):
    """One step of `case`: the result object."""
    args.case = case
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device(args.device)
    start = time.time()
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with torch.device(device):
        model, source = build(torch, args)
    model.to(dtype)
    rows = parameter_kinds(torch, args.model, model)
    if args.checkpoint:
        # After the names are read: the wrappers add `.block` to them.
        checkpoint_blocks(torch, args, model)
    train = trainable(case, rows)
    for n, p, _ in rows:
        p.requires_grad_(n in train)
    model.train(not case.endswith("-bn-eval"))
    params = [p for n, p, _ in rows if n in train]
    x, targets = make_input(torch, args, model, dtype, device)
    if not params and not x.requires_grad:
        if args.all_cases:
            return None  # as leangrad, which refuses such a case
        raise SystemExit(f"case `{case}` trains nothing in {args.model}")
    owned = list(model.parameters()) + list(model.buffers())
    owned_keys = {storage_key(t) for t in owned}
    saved = {}

    def pack(t):
        key = storage_key(t)
        if key not in owned_keys:
            saved[key] = t.untyped_storage().nbytes()
        return t

    opts = {}
    if args.fused:
        opts = {p: optimizer(torch, args, [p]) for p in params}

        def step_in_backward(p):
            opts[p].step()
            opts[p].zero_grad(set_to_none=True)

        for p in params:
            p.register_post_accumulate_grad_hook(step_in_backward)
    elif params:
        opts = {None: optimizer(torch, args, params)}

    def step():
        amp = {"bf16": torch.bfloat16, "f16": torch.float16}.get(args.autocast)
        # No autocast context at all without --autocast: torch 2.15 refuses
        # even a disabled one on the meta device ("unsupported scalarType").
        cast = (torch.autocast(device_type=args.device, dtype=amp) if amp is not None
                else contextlib.nullcontext())
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
            loss = torch.nn.functional.cross_entropy(logits(args, model, x), targets)
        if args.device == "meta":
            return  # nothing is allocated: the saved bytes are all there is
        loss.backward()
        if params and not args.fused:
            opts[None].step()

    peak, method = None, None
    if args.device == "cpu":
        begin = storages_bytes(owned + [x, targets])
        with torch.autograd.profiler.profile(profile_memory=True, use_kineto=False) as prof:
            step()
        peak = begin + allocation_peak(prof.kineto_results)
        method = "cpu: starting storages + profiler allocation peak"
    elif args.device == "cuda":
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        method = "cuda: torch.cuda.max_memory_allocated"
    else:
        step()
    return {
        "model": args.model,
        "source": source,
        "versions": versions(),
        "batch": args.batch,
        "size": args.size if args.model in CNNS or args.model == "vit_b16" else None,
        "seq": None if args.model in CNNS or args.model == "vit_b16" else args.seq,
        "classes": model.config.vocab_size if args.model in LMS else args.classes,
        "dtype": args.dtype,
        "optimizer": args.optimizer,
        "fused": args.fused,
        "checkpoint": args.checkpoint,
        "optimizer_state": args.optimizer_state,
        "autocast": args.autocast,
        "case": case,
        "device": args.device,
        "attention": None if args.model in CNNS else args.attention,
        "trainable_parameters": sum(p.numel() for p in params),
        "parameter_bytes": storages_bytes(owned),
        "optimizer_state_bytes": None if args.device == "meta" else storages_bytes(
            t for o in opts.values() for s in o.state.values() for t in s.values()
            if torch.is_tensor(t) and t.device == device),
        "saved_bytes": sum(saved.values()),
        "saved_storages": len(saved),
        "step_peak_bytes": peak,
        "step_peak_method": method,
        "seconds": round(time.time() - start, 3),
    }


def versions():
    out = {}
    for name in ("torch", "torchvision", "transformers"):
        mod = sys.modules.get(name)
        out[name] = getattr(mod, "__version__", None) if mod else None
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=CNNS + HF, required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--case", action="append", choices=CASES,
                   help="repeat for several cases (one JSON object per line)")
    p.add_argument("--all-cases", action="store_true",
                   help="every case that trains something, one JSON object per line")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    p.add_argument("--fused", action="store_true")
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--optimizer-state", choices=["f32", "bf16", "8bit"], default="f32")
    p.add_argument("--autocast", choices=["bf16", "f16"], default=None)
    p.add_argument("--device", choices=["meta", "cpu", "cuda"], default="meta")
    p.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa",
                   help="Hugging Face attention implementation (transformers' default: sdpa)")
    args = p.parse_args()
    if args.optimizer_state == "bf16":
        # torch.optim keeps an f32 parameter's moments in f32; nothing in
        # PyTorch or bitsandbytes keeps them in bf16.
        print(json.dumps({"missing": [], "unsupported":
                          "PyTorch has no optimizer with bf16 state for f32 parameters"}))
        sys.exit(EXIT_MISSING)
    if args.autocast and args.device == "meta":
        print(json.dumps({"missing": [], "unsupported":
                          "PyTorch's autocast does not run on the meta device (use --device cpu or cuda)"}))
        sys.exit(EXIT_MISSING)
    missing = [m for m in needed_modules(args) if importlib.util.find_spec(m) is None]
    if missing:
        print(json.dumps({"missing": missing, "install": "pip install " + " ".join(missing)}))
        sys.exit(EXIT_MISSING)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("device cuda: this PyTorch sees no CUDA device")
    if args.model in HF:
        import transformers

        transformers.logging.set_verbosity_error()
    for case in CASES if args.all_cases else args.case or ["all"]:
        result = measure(torch, args, case)
        if result is not None:
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
