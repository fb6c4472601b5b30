//! The encoder of Hugging Face's `BertModel` (BERT-base and smaller), with
//! its state-dict names: `embeddings.{word,position,token_type}_embeddings`,
//! `embeddings.LayerNorm`, `encoder.layer.N.{attention.self.{query,key,
//! value}, attention.output.{dense,LayerNorm}, intermediate.dense,
//! output.{dense,LayerNorm}}`, `pooler.dense`. Optional padding mask; no
//! dropout. RoBERTa and XLM-RoBERTa (`RobertaModel`,
//! `XLMRobertaModel`) are the same network with the same names and
//! positions counted after the padding token ([`PositionIds`]).

use super::checkpoint_block;
use super::transformer::{
    check_sizes, key_mask, layer_norm, leaf_kinds, leaf_params, leaf_set_requires_grad, linear,
    pool, FeedForward, Leaf, Leaves, LeavesMut, SelfAttention, TextInput, INITIALIZER_RANGE,
};
use super::Ctx;
use crate::memory::scope;
use crate::nn::{
    position_ids_from_input_ids, Embedding, Init, LayerKind, LayerNorm, Linear, Module,
};
use crate::{DType, Device, Error, Result, Tensor};

/// The shape of a [`Bert`] (Hugging Face's `BertConfig` fields).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BertConfig {
    /// Rows of the word embedding table.
    pub vocab_size: usize,
    /// Width of the token vectors.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads (must divide `hidden_size`).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Longest sequence (rows of the position table).
    pub max_position_embeddings: usize,
    /// Rows of the token-type (segment) table.
    pub type_vocab_size: usize,
    /// LayerNorm epsilon (1e-12 in Hugging Face's default).
    pub layer_norm_eps: f64,
    /// Whether the model has `pooler.dense` (as `BertModel` by default).
    pub add_pooling_layer: bool,
    /// The padding token (0 in Hugging Face's default and BERT's
    /// vocabularies): its row of `word_embeddings` starts at zero and gets
    /// no gradient, as `nn.Embedding(padding_idx=pad_token_id)`.
    pub pad_token_id: Option<usize>,
    /// How token positions are numbered: from 0 (BERT) or after the
    /// padding token (RoBERTa, XLM-RoBERTa).
    pub position_ids: PositionIds,
}

/// How a [`Bert`] numbers the positions it looks up in
/// `position_embeddings`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionIds {
    /// BERT: the tokens of a row are at positions `0, 1, …, L-1`.
    FromZero,
    /// RoBERTa and XLM-RoBERTa (Hugging Face's
    /// `create_position_ids_from_input_ids`): a padding token is at
    /// position `pad_token_id`, the `n`-th other token of its row at
    /// `pad_token_id + n`; input embeddings at `pad_token_id + 1, …`. The
    /// padding row of `position_embeddings` gets no gradient. Needs a
    /// `pad_token_id`; rows hold at most `max_position_embeddings -
    /// pad_token_id - 1` tokens.
    AfterPadding,
}

impl BertConfig {
    /// BERT-base (uncased vocabulary of 30522).
    pub fn bert_base() -> BertConfig {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            add_pooling_layer: true,
            pad_token_id: Some(0),
            position_ids: PositionIds::FromZero,
        }
    }

    /// RoBERTa-base (`roberta-base`: byte-level BPE vocabulary of 50265,
    /// 514 positions of which the first two are never a token's, one token
    /// type, padding token 1, LayerNorm epsilon 1e-5).
    pub fn roberta_base() -> BertConfig {
        BertConfig {
            vocab_size: 50265,
            max_position_embeddings: 514,
            type_vocab_size: 1,
            layer_norm_eps: 1e-5,
            pad_token_id: Some(1),
            position_ids: PositionIds::AfterPadding,
            ..BertConfig::bert_base()
        }
    }

    /// XLM-RoBERTa-base (`xlm-roberta-base`): RoBERTa-base with the
    /// 250002-token SentencePiece vocabulary of 100 languages.
    pub fn xlm_roberta_base() -> BertConfig {
        BertConfig {
            vocab_size: 250_002,
            ..BertConfig::roberta_base()
        }
    }

    /// A tiny BERT for tests: vocabulary 50, width 16, 2 layers, 2 heads,
    /// 16 positions.
    pub fn tiny() -> BertConfig {
        BertConfig {
            vocab_size: 50,
            hidden_size: 16,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            intermediate_size: 32,
            max_position_embeddings: 16,
            ..BertConfig::bert_base()
        }
    }
}

/// One post-norm encoder layer: `a = LN(dense(attn(x)) + x)`, then
/// `LN(mlp(a) + a)`.
#[derive(Clone)]
struct BertLayer {
    attention: SelfAttention,
    attention_dense: Linear,
    attention_norm: LayerNorm,
    mlp: FeedForward,
    output_norm: LayerNorm,
}

impl BertLayer {
    fn new(cfg: &BertConfig, c: Ctx, seed: u64) -> Result<BertLayer> {
        let (d, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        Ok(BertLayer {
            attention: SelfAttention::new(d, cfg.num_attention_heads, c, seed)?,
            attention_dense: linear("dense", d, d, c, seed.wrapping_add(3))?,
            attention_norm: layer_norm("LayerNorm", d, eps, c)?,
            mlp: FeedForward::new(d, cfg.intermediate_size, c, seed.wrapping_add(4))?,
            output_norm: layer_norm("LayerNorm", d, eps, c)?,
        })
    }

    fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let a = {
            let _s = scope("attention");
            let ctx = {
                let _a = scope("self");
                self.attention.forward(x, mask)?
            };
            let _o = scope("output");
            // Each residual sum and its norm write over the projection's
            // output (buffer reuse).
            let y = self.attention_dense.forward(&ctx)?.add_owned(x)?;
            self.attention_norm.forward_owned(y)?
        };
        let y = self.mlp.forward(&a)?.add_owned(&a)?;
        drop(a);
        let _o = scope("output");
        self.output_norm.forward_owned(y)
    }

    fn leaves(&self, p: &str) -> Leaves<'_> {
        let mut v = self.attention.leaves(&format!("{p}.attention.self"));
        v.push((format!("{p}.attention.output.dense"), &self.attention_dense));
        v.push((
            format!("{p}.attention.output.LayerNorm"),
            &self.attention_norm,
        ));
        v.push((format!("{p}.intermediate.dense"), &self.mlp.intermediate));
        v.push((format!("{p}.output.dense"), &self.mlp.output));
        v.push((format!("{p}.output.LayerNorm"), &self.output_norm));
        v
    }

    fn leaves_mut(&mut self, p: &str) -> LeavesMut<'_> {
        let mut v = self.attention.leaves_mut(&format!("{p}.attention.self"));
        v.push((
            format!("{p}.attention.output.dense"),
            &mut self.attention_dense,
        ));
        v.push((
            format!("{p}.attention.output.LayerNorm"),
            &mut self.attention_norm,
        ));
        v.push((
            format!("{p}.intermediate.dense"),
            &mut self.mlp.intermediate,
        ));
        v.push((format!("{p}.output.dense"), &mut self.mlp.output));
        v.push((format!("{p}.output.LayerNorm"), &mut self.output_norm));
        v
    }
}

/// Hugging Face's `BertModel`: word + position + token-type embeddings,
/// LayerNorm, post-norm encoder layers (exact GELU), tanh pooler on the
/// first token. Embedding lookups save their indices only when the table
/// needs grad; positions are a view of the position table (nothing saved).
pub struct Bert {
    config: BertConfig,
    word_embeddings: Embedding,
    position_embeddings: Embedding,
    token_type_embeddings: Embedding,
    norm: LayerNorm,
    layers: Vec<BertLayer>,
    pooler: Option<Linear>,
    checkpointing: bool,
}

impl Bert {
    /// A BERT of `config`, initialised as Hugging Face's `_init_weights`
    /// (every weight and embedding table N(0, 0.02²), the padding row 0,
    /// biases 0, LayerNorms 1 and 0; seeded), ready for
    /// [`crate::io::load_state_dict`].
    pub fn new(config: BertConfig, dtype: DType, device: Device, seed: u64) -> Result<Bert> {
        let cfg = config;
        let d = cfg.hidden_size;
        let sizes = [
            cfg.vocab_size,
            cfg.num_hidden_layers,
            cfg.intermediate_size,
            cfg.max_position_embeddings,
            cfg.type_vocab_size,
        ];
        check_sizes("Bert", &sizes, d, cfg.num_attention_heads)?;
        let c = (dtype, device);
        let table = |name: &str, n: usize, padding: Option<i64>, s: u64| {
            Embedding::builder(n, d)
                .name(name)
                .padding_idx(padding)
                .weight_init(Init::normal(INITIALIZER_RANGE))
                .dtype(dtype)
                .seed(seed.wrapping_add(s))
                .build(&device)
        };
        let pad = cfg
            .pad_token_id
            .map(|p| {
                i64::try_from(p).map_err(|_| Error::InvalidArgument {
                    op: "Bert",
                    msg: format!("pad_token_id {p} is not an index"),
                })
            })
            .transpose()?;
        let position_pad = match cfg.position_ids {
            PositionIds::FromZero => None,
            PositionIds::AfterPadding => match pad {
                Some(p) if (p as usize) < cfg.max_position_embeddings => Some(p),
                _ => {
                    return Err(Error::InvalidArgument {
                        op: "Bert",
                        msg: format!(
                            "positions after the padding token need a pad_token_id below \
                             max_position_embeddings ({}); got {:?}",
                            cfg.max_position_embeddings, cfg.pad_token_id
                        ),
                    })
                }
            },
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| BertLayer::new(&cfg, c, seed.wrapping_add(100 * (i as u64 + 1))))
            .collect::<Result<_>>()?;
        Ok(Bert {
            config,
            word_embeddings: table("word_embeddings", cfg.vocab_size, pad, 1)?,
            position_embeddings: table(
                "position_embeddings",
                cfg.max_position_embeddings,
                position_pad,
                2,
            )?,
            token_type_embeddings: table("token_type_embeddings", cfg.type_vocab_size, None, 3)?,
            norm: layer_norm("LayerNorm", d, cfg.layer_norm_eps, c)?,
            layers,
            pooler: cfg
                .add_pooling_layer
                .then(|| linear("dense", d, d, c, seed.wrapping_add(7)))
                .transpose()?,
            checkpointing: false,
        })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> BertConfig {
        self.config
    }

    /// Runs each encoder layer as a checkpointed segment when `on` (Hugging Face's
    /// `gradient_checkpointing_enable()`): forward keeps only each encoder layer's
    /// input, backward runs the encoder layer again; gradients are unchanged, one
    /// more forward of the encoder layers is the cost. Off by default.
    pub fn gradient_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// Whether [`Bert::gradient_checkpointing`] is on.
    pub fn is_gradient_checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// The last hidden state `[B, L, hidden]` and, with a pooler, the
    /// pooled first-token vector `[B, hidden]`. `token_type_ids` (`[B, L]`)
    /// default to all zeros; `attention_mask` (`[B, L]`, 1 = attend, 0 =
    /// padding, any dtype) keeps every token from attending to padding
    /// (kept as a `B·L`-byte U8 mask when attention saves it).
    pub fn encode_masked(
        &self,
        input: TextInput,
        token_type_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let mut h = {
            let _s = scope("embeddings");
            let x = match input {
                TextInput::Ids(ids) => self.word_embeddings.forward(ids)?,
                TextInput::Embeds(e) => e.clone(),
            };
            let s = x.shape().to_vec();
            let pos = {
                let _p = scope("position_embeddings");
                self.positions(input, &s)?
            };
            let types = match token_type_ids {
                Some(t) => self.token_type_embeddings.forward(t)?,
                None => self.token_type_embeddings.weight.narrow(0, 0, 1)?,
            };
            self.norm.forward_owned(x.add(&types)?.add_owned(&pos)?)?
        };
        let mask = attention_mask
            .map(|m| key_mask(m, h.shape()[0], h.shape()[1]))
            .transpose()?;
        {
            let _e = scope("encoder");
            for (i, layer) in self.layers.iter().enumerate() {
                let _l = scope(format!("layer.{i}"));
                h = match (self.checkpointing, &mask) {
                    (true, Some(m)) => {
                        checkpoint_block(layer, &[&h, m], |l, xs| l.forward(&xs[0], Some(&xs[1])))?
                    }
                    (true, None) => {
                        checkpoint_block(layer, &[&h], |l, xs| l.forward(&xs[0], None))?
                    }
                    (false, _) => layer.forward(&h, mask.as_ref())?,
                };
            }
        }
        let pooled = self.pooler.as_ref().map(|p| pool(p, &h)).transpose()?;
        Ok((h, pooled))
    }

    /// The position embeddings of an input whose embeddings have shape
    /// `s` (`[B, L, hidden]`): a view of the table's rows (positions from
    /// zero, or RoBERTa's input embeddings), or for RoBERTa's token ids a
    /// lookup of [`position_ids_from_input_ids`] (saving the positions when
    /// the table needs grad).
    fn positions(&self, input: TextInput, s: &[usize]) -> Result<Tensor> {
        let cfg = &self.config;
        let first = match cfg.position_ids {
            PositionIds::FromZero => 0,
            PositionIds::AfterPadding => cfg.pad_token_id.unwrap_or(0) + 1,
        };
        if s.len() != 3 || s[2] != cfg.hidden_size || first + s[1] > cfg.max_position_embeddings {
            return Err(Error::ShapeMismatch {
                op: "Bert",
                lhs: vec![0, cfg.max_position_embeddings - first, cfg.hidden_size],
                rhs: s.to_vec(),
            });
        }
        match (cfg.position_ids, input) {
            (PositionIds::AfterPadding, TextInput::Ids(ids)) => {
                let ids = position_ids_from_input_ids(ids, first as i64 - 1)?;
                self.position_embeddings.forward(&ids)
            }
            _ => self.position_embeddings.weight.narrow(0, first, s[1]),
        }
    }

    /// [`Bert::encode_masked`] without an attention mask.
    pub fn encode(
        &self,
        input: TextInput,
        token_type_ids: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.encode_masked(input, token_type_ids, None)
    }

    /// The last hidden state of token ids `[B, L]` (I64 or U32).
    pub fn forward_ids(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(self.encode(TextInput::Ids(ids), None)?.0)
    }

    /// The last hidden state of input embeddings `[B, L, hidden]`.
    pub fn forward_embeds(&self, embeds: &Tensor) -> Result<Tensor> {
        Ok(self.encode(TextInput::Embeds(embeds), None)?.0)
    }

    /// Makes each parameter require grad exactly when `want(name)` is true
    /// (state-dict names); values are kept. Frozen layers then save only
    /// what the remaining gradients need.
    pub fn set_requires_grad(&mut self, mut want: impl FnMut(&str) -> bool) -> Result<()> {
        leaf_set_requires_grad(self.leaves_mut(), &mut want)
    }

    fn leaves(&self) -> Leaves<'_> {
        let mut v: Leaves = vec![
            ("embeddings.word_embeddings".into(), &self.word_embeddings),
            (
                "embeddings.position_embeddings".into(),
                &self.position_embeddings,
            ),
            (
                "embeddings.token_type_embeddings".into(),
                &self.token_type_embeddings,
            ),
            ("embeddings.LayerNorm".into(), &self.norm),
        ];
        for (i, l) in self.layers.iter().enumerate() {
            v.extend(l.leaves(&format!("encoder.layer.{i}")));
        }
        v.extend(
            self.pooler
                .as_ref()
                .map(|p| ("pooler.dense".into(), p as &dyn Module)),
        );
        v
    }

    fn leaves_mut(&mut self) -> LeavesMut<'_> {
        let mut v: LeavesMut = vec![
            (
                "embeddings.word_embeddings".into(),
                &mut self.word_embeddings as &mut dyn Leaf,
            ),
            (
                "embeddings.position_embeddings".into(),
                &mut self.position_embeddings,
            ),
            (
                "embeddings.token_type_embeddings".into(),
                &mut self.token_type_embeddings,
            ),
            ("embeddings.LayerNorm".into(), &mut self.norm),
        ];
        for (i, l) in self.layers.iter_mut().enumerate() {
            v.extend(l.leaves_mut(&format!("encoder.layer.{i}")));
        }
        v.extend(
            self.pooler
                .as_mut()
                .map(|p| ("pooler.dense".into(), p as &mut dyn Leaf)),
        );
        v
    }
}

impl Module for Bert {
    /// The last hidden state `[B, L, hidden]` of token ids `[B, L]` (I64).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_ids(ids)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        leaf_params(self.leaves())
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        leaf_kinds(self.leaves())
    }
}
