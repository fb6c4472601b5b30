"""Writes the transformer fixtures of tests/models_transformers.rs.

Builds tiny Hugging Face `ViTModel`, `BertModel`, `RobertaModel`,
`GPT2Model` and `MistralForCausalLM`s (with
`transformers` when importable; eager attention, dropout 0) and writes to
tests/fixtures/models/, with the layout of export.py:

* `<model>.safetensors`: the state dict, with the classic Hugging Face
  names (transformers 5 renamed ViT's: `layers.N.attention.q_proj` and so
  on; they are mapped back to `encoder.layer.N.attention.attention.query`,
  the names of the published checkpoints);
* `<model>_<case>.safetensors`: `input` (images; for the text models the
  input embeddings, fed through `inputs_embeds`, in the `input` case only)
  or `input_ids` (I64), BERT's `token_type_ids` and `attention_mask` (the
  last two tokens of the second sequence are padding; RoBERTa's first
  sequence also starts with one padding token, and its padding tokens are
  the padding id 1, which moves its position ids), `output` (ViT/BERT: the
  last hidden state; GPT-2: logits through the LM head tied to `wte`;
  Mistral: logits through `lm_head`, with grouped-query attention, a
  sliding window shorter than the sequence and the second sequence's
  last two tokens padding),
  `pooled` (ViT/BERT pooler output), probes `probe` and `probe.pooled`
  (loss = sum(output * probe) + sum(pooled * probe.pooled)), `grad.<name>`
  for every parameter that requires grad and `grad.input` when the input
  does. Reference computed in f64, stored as f32.

Cases: all, input (every parameter frozen, input grad), norm (LayerNorms
and RMSNorms only), linear (Q/K/V/dense/Conv1D/pooler/projections only), conv (ViT's patch
projection only), surgical-first / surgical-last (the parameters of the
first / last ceil(L/4) layers, a parameter's layer being its name without
the last dot-component, layers in state-dict order).

Run from the repository root: python3 python-compare/export_transformers.py
[MODEL …] (default: every model; e.g. `roberta_tiny` writes only its files).
"""

import math
import os
import re
import sys

import torch
from torch import nn
from safetensors.torch import save_file

try:
    from transformers import (BertConfig, BertModel, GPT2Config, GPT2Model, MistralConfig,
                              MistralForCausalLM, RobertaConfig, RobertaModel, ViTConfig,
                              ViTModel)
    from transformers.models.mistral.modeling_mistral import MistralRMSNorm
    from transformers.pytorch_utils import Conv1D
except ImportError as e:  # the reference is Hugging Face's own code
    raise SystemExit(f"needs transformers (pip install transformers): {e}")

OUT = os.path.join("tests", "fixtures", "models")
BATCH, SEQ = 2, 6

# transformers 5 ViT name -> classic name (the published checkpoints').
VIT_RENAMES = [
    (r"^layers\.(\d+)\.attention\.q_proj\.", r"encoder.layer.\1.attention.attention.query."),
    (r"^layers\.(\d+)\.attention\.k_proj\.", r"encoder.layer.\1.attention.attention.key."),
    (r"^layers\.(\d+)\.attention\.v_proj\.", r"encoder.layer.\1.attention.attention.value."),
    (r"^layers\.(\d+)\.attention\.o_proj\.", r"encoder.layer.\1.attention.output.dense."),
    (r"^layers\.(\d+)\.mlp\.fc1\.", r"encoder.layer.\1.intermediate.dense."),
    (r"^layers\.(\d+)\.mlp\.fc2\.", r"encoder.layer.\1.output.dense."),
    (r"^layers\.(\d+)\.", r"encoder.layer.\1."),
]
# Order of a classic ViTLayer's parameters (attention, intermediate,
# output, layernorm_before, layernorm_after).
VIT_LAYER_ORDER = ["attention.attention.query", "attention.attention.key",
                   "attention.attention.value", "attention.output.dense",
                   "intermediate.dense", "output.dense", "layernorm_before",
                   "layernorm_after"]


def vit_name(n):
    for pat, rep in VIT_RENAMES:
        if re.match(pat, n):
            return re.sub(pat, rep, n)
    return n


def vit_rank(n):
    m = re.match(r"^encoder\.layer\.(\d+)\.(.*)\.(weight|bias)$", n)
    if m is None:
        head = ["embeddings.cls_token", "embeddings.position_embeddings"]
        if n in head or n.startswith("embeddings."):
            return (0, 0, 0)
        return (2, 0, 0)
    return (1, int(m.group(1)), VIT_LAYER_ORDER.index(m.group(2)))


def build(name):
    common = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if name == "vit_tiny":
        cfg = ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, image_size=16, patch_size=8,
                        num_channels=3, **common)
        return ViTModel(cfg), vit_name, vit_rank
    if name == "bert_tiny":
        cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=32,
                         max_position_embeddings=16, type_vocab_size=2, **common)
        return BertModel(cfg), (lambda n: n), None
    if name == "roberta_tiny":
        cfg = RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=32,
                            max_position_embeddings=18, type_vocab_size=1, pad_token_id=1,
                            layer_norm_eps=1e-5, **common)
        return RobertaModel(cfg), (lambda n: n), None
    if name == "mistral_tiny":
        # MistralConfig.tiny() of src/models/mistral.rs.
        cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, max_position_embeddings=32, rms_norm_eps=1e-6,
                            rope_theta=10000.0, sliding_window=5, tie_word_embeddings=False,
                            attention_dropout=0.0)
        return MistralForCausalLM(cfg), (lambda n: n), None
    cfg = GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                     n_inner=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    return GPT2Model(cfg), (lambda n: n), None


def kinds(model, rename):
    """Classic name -> layer kind, as leangrad's parameter_kinds says."""
    out = {}
    for mname, m in model.named_modules():
        if isinstance(m, (nn.LayerNorm, MistralRMSNorm)):
            kind = "norm"
        elif isinstance(m, (nn.Linear, Conv1D)):
            kind = "linear"
        elif isinstance(m, nn.Conv2d):
            kind = "conv"
        elif isinstance(m, nn.Embedding):
            kind = "embedding"
        else:
            kind = "other"
        for pname, _ in m.named_parameters(recurse=False):
            out[rename(f"{mname}.{pname}" if mname else pname)] = kind
    return out


def trainable(case, names, kind):
    layers = []
    for n in names:
        p = n.rsplit(".", 1)[0]
        if p not in layers:
            layers.append(p)
    q = math.ceil(len(layers) / 4)
    if case == "all":
        return set(names)
    if case == "input":
        return set()
    if case in ("norm", "linear", "conv"):
        return {n for n in names if kind[n] == case}
    pick = set(layers[:q] if case == "surgical-first" else layers[len(layers) - q:])
    return {n for n in names if n.rsplit(".", 1)[0] in pick}


def run(name, model, case, inputs):
    """Outputs of the f64 model on the case's inputs."""
    if name == "vit_tiny":
        o = model(pixel_values=inputs["input"])
        return {"output": o.last_hidden_state, "pooled": o.pooler_output}
    kw = {}
    if "input" in inputs:
        kw["inputs_embeds"] = inputs["input"]
    else:
        kw["input_ids"] = inputs["input_ids"]
    for k in ("token_type_ids", "attention_mask"):
        if k in inputs:
            kw[k] = inputs[k]
    o = model(**kw)
    if name in ("bert_tiny", "roberta_tiny"):
        return {"output": o.last_hidden_state, "pooled": o.pooler_output}
    if name == "mistral_tiny":
        return {"output": o.logits}
    return {"output": o.last_hidden_state @ model.wte.weight.t()}


def export(name, seed):
    torch.manual_seed(seed)
    model, rename, rank = build(name)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for mname, m in model.named_modules():
            if isinstance(m, (nn.LayerNorm, MistralRMSNorm)):
                m.weight.uniform_(0.5, 1.5)
            for pname, prm in m.named_parameters(recurse=False):
                if pname == "bias":
                    prm.uniform_(-0.2, 0.2)
    named = [(rename(n), p) for n, p in model.named_parameters()]
    if rank is not None:
        named.sort(key=lambda np_: rank(np_[0]))
    names = [n for n, _ in named]
    kind = kinds(model, rename)
    state = {rename(k): v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(OUT, f"{name}.safetensors"))
    cfg = model.config
    cases = ["all", "input", "norm", "linear", "surgical-first", "surgical-last"]
    if name == "vit_tiny":
        cases.insert(4, "conv")
    model = model.double()
    model.eval()
    by_name = dict((rename(n), p) for n, p in model.named_parameters())
    for case in cases:
        train = trainable(case, names, kind)
        for n, prm in by_name.items():
            prm.requires_grad_(n in train)
            prm.grad = None
        io = {}
        if name == "vit_tiny":
            io["input"] = torch.randn(BATCH, cfg.num_channels, cfg.image_size, cfg.image_size)
        elif case == "input":
            io["input"] = torch.randn(BATCH, SEQ, cfg.hidden_size)
        else:
            io["input_ids"] = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
        if name == "bert_tiny":
            io["token_type_ids"] = torch.randint(0, 2, (BATCH, SEQ))
            # Padding: the last two tokens of the second sequence.
            mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
            mask[1, -2:] = 0
            io["attention_mask"] = mask
        if name == "mistral_tiny":
            # Right padding: the last two tokens of the second sequence.
            mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
            mask[1, -2:] = 0
            io["attention_mask"] = mask
        if name == "roberta_tiny":
            mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
            mask[0, 0] = 0
            mask[1, -2:] = 0
            io["attention_mask"] = mask
            if "input_ids" in io:
                ids = io["input_ids"]
                ids[ids == cfg.pad_token_id] = 2
                ids[mask == 0] = cfg.pad_token_id
        inputs = {k: (v.double() if v.is_floating_point() else v) for k, v in io.items()}
        x = inputs.get("input")
        if x is not None:
            x.requires_grad_(case == "input")
        outs = run(name, model, case, inputs)
        loss = 0
        f32 = lambda t: t.detach().float().contiguous().clone()
        for k, y in outs.items():
            probe = torch.randn(y.shape)
            io["probe" if k == "output" else f"probe.{k}"] = probe
            io[k] = f32(y)
            loss = loss + (y * probe.double()).sum()
        loss.backward()
        for n in names:
            if n in train:
                io[f"grad.{n}"] = f32(by_name[n].grad)
        if x is not None and x.requires_grad:
            io["grad.input"] = f32(x.grad)
        save_file(io, os.path.join(OUT, f"{name}_{case}.safetensors"))


def main():
    os.makedirs(OUT, exist_ok=True)
    models = ["vit_tiny", "bert_tiny", "gpt2_tiny", "roberta_tiny", "mistral_tiny"]
    wanted = sys.argv[1:] or models
    for name in wanted:
        if name not in models:
            raise SystemExit(f"unknown model {name}; one of {models}")
        export(name, models.index(name))


if __name__ == "__main__":
    main()
