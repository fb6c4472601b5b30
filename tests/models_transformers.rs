//! Tiny ViT, BERT, RoBERTa and GPT-2 against Hugging Face transformers (fixtures
//! written by `python-compare/export_transformers.py`, reference in f64):
//! strict state-dict load, outputs and every gradient of
//! `Σ sum(output * probe)` for the freezing cases, names one-to-one; the
//! lean save policy against SaveAll; full-size parameter counts; strict
//! loading errors by name.
//!
//! Tolerances are relative to each tensor's largest magnitude: 1e-4 in
//! f32, 1e-5 in f64. Measured worst (outputs and all gradients over all
//! cases): ViT 7.6e-7 / 3.6e-7, BERT 2.2e-7 / 5.0e-8, RoBERTa 2.8e-7 /
//! 5.5e-8, GPT-2 4.9e-7 / 5.5e-8 (f32 / f64; the f64 figures are the f32
//! rounding of the stored reference).

mod common;
#[path = "common/hf.rs"]
mod hf;

use common::models::{fixture, CPU};
use hf::{check_model, check_policies, run, HfModel};
use leangrad::autograd::SavePolicy;
use leangrad::io::{load_state_dict, state_dict, LoadOptions};
use leangrad::models::{
    classic_vit_name, Bert, BertConfig, Gpt2, Gpt2Config, PositionIds, TextInput, ViT, ViTConfig,
};
use leangrad::nn::{LayerKind, Module};
use leangrad::{DType, Error, Tensor};
use std::collections::{BTreeMap, BTreeSet};

const TEXT_CASES: [&str; 6] = [
    "all",
    "input",
    "norm",
    "linear",
    "surgical-first",
    "surgical-last",
];
const VIT_CASES: [&str; 7] = [
    "all",
    "input",
    "norm",
    "linear",
    "conv",
    "surgical-first",
    "surgical-last",
];

fn text_input<'a>(x: Option<&'a Tensor>, io: &'a BTreeMap<String, Tensor>) -> TextInput<'a> {
    match x {
        Some(e) => TextInput::Embeds(e),
        None => TextInput::Ids(&io["input_ids"]),
    }
}

impl HfModel for ViT {
    fn freeze(&mut self, want: &dyn Fn(&str) -> bool) {
        self.set_requires_grad(want).unwrap();
    }
    fn outputs(&self, x: Option<&Tensor>, _io: &BTreeMap<String, Tensor>) -> Vec<(String, Tensor)> {
        let (h, pooled) = self.encode(x.expect("images")).unwrap();
        vec![("output".into(), h), ("pooled".into(), pooled.unwrap())]
    }
}

impl HfModel for Bert {
    fn freeze(&mut self, want: &dyn Fn(&str) -> bool) {
        self.set_requires_grad(want).unwrap();
    }
    fn outputs(&self, x: Option<&Tensor>, io: &BTreeMap<String, Tensor>) -> Vec<(String, Tensor)> {
        let tt = io.get("token_type_ids");
        let mask = io.get("attention_mask");
        let (h, pooled) = self.encode_masked(text_input(x, io), tt, mask).unwrap();
        vec![("output".into(), h), ("pooled".into(), pooled.unwrap())]
    }
}

impl HfModel for Gpt2 {
    fn freeze(&mut self, want: &dyn Fn(&str) -> bool) {
        self.set_requires_grad(want).unwrap();
    }
    fn outputs(&self, x: Option<&Tensor>, io: &BTreeMap<String, Tensor>) -> Vec<(String, Tensor)> {
        vec![("output".into(), self.logits(text_input(x, io)).unwrap())]
    }
}

fn vit(d: DType) -> ViT {
    ViT::new(ViTConfig::tiny(), d, CPU, 1).unwrap()
}
fn bert(d: DType) -> Bert {
    Bert::new(BertConfig::tiny(), d, CPU, 1).unwrap()
}
/// RoBERTa's tiny configuration: BERT's tiny one with positions after the
/// padding token 1, one token type, 18 positions, epsilon 1e-5.
fn roberta(d: DType) -> Bert {
    let config = BertConfig {
        max_position_embeddings: 18,
        type_vocab_size: 1,
        layer_norm_eps: 1e-5,
        pad_token_id: Some(1),
        position_ids: PositionIds::AfterPadding,
        ..BertConfig::tiny()
    };
    Bert::new(config, d, CPU, 1).unwrap()
}
fn gpt2(d: DType) -> Gpt2 {
    Gpt2::new(Gpt2Config::tiny(), d, CPU, 1).unwrap()
}

#[test]
fn tiny_vit_matches_hugging_face_f32_and_f64() {
    check_model(&vit, "vit_tiny", &VIT_CASES, DType::F32, 1e-4);
    check_model(&vit, "vit_tiny", &VIT_CASES, DType::F64, 1e-5);
}

#[test]
fn tiny_bert_matches_hugging_face_f32_and_f64() {
    check_model(&bert, "bert_tiny", &TEXT_CASES, DType::F32, 1e-4);
    check_model(&bert, "bert_tiny", &TEXT_CASES, DType::F64, 1e-5);
}

/// Padding on both sides of RoBERTa's sequences (ids 1 where the mask is
/// 0): positions counted after the padding token, the padding rows of the
/// word and position tables without a gradient.
#[test]
fn tiny_roberta_matches_hugging_face_f32_and_f64() {
    check_model(&roberta, "roberta_tiny", &TEXT_CASES, DType::F32, 1e-4);
    check_model(&roberta, "roberta_tiny", &TEXT_CASES, DType::F64, 1e-5);
}

#[test]
fn tiny_gpt2_matches_hugging_face_f32_and_f64() {
    check_model(&gpt2, "gpt2_tiny", &TEXT_CASES, DType::F32, 1e-4);
    check_model(&gpt2, "gpt2_tiny", &TEXT_CASES, DType::F64, 1e-5);
}

#[test]
fn lean_policy_saves_no_more_with_bit_identical_gradients() {
    let report = |m: &str, b: Vec<(String, usize, usize)>| {
        for (case, l, a) in b {
            eprintln!("{m} {case}: lean {l} B, save-all {a} B");
        }
    };
    report("vit_tiny", check_policies(&vit, "vit_tiny", &VIT_CASES));
    report("bert_tiny", check_policies(&bert, "bert_tiny", &TEXT_CASES));
    report("gpt2_tiny", check_policies(&gpt2, "gpt2_tiny", &TEXT_CASES));
    report(
        "roberta_tiny",
        check_policies(&roberta, "roberta_tiny", &TEXT_CASES),
    );
}

#[test]
fn names_are_hugging_face_state_dict_names() {
    let names = |m: &dyn Module| -> BTreeSet<String> {
        state_dict(m, "").into_iter().map(|(n, _)| n).collect()
    };
    let file = |f: &str| -> BTreeSet<String> { fixture(f).into_keys().collect() };
    assert_eq!(names(&vit(DType::F32)), file("vit_tiny.safetensors"));
    assert_eq!(names(&bert(DType::F32)), file("bert_tiny.safetensors"));
    assert_eq!(names(&gpt2(DType::F32)), file("gpt2_tiny.safetensors"));
    assert_eq!(
        names(&roberta(DType::F32)),
        file("roberta_tiny.safetensors")
    );
}

#[test]
fn parameter_kinds_follow_the_layer_types() {
    let kinds = |m: &dyn Module| -> BTreeMap<String, LayerKind> {
        let k: BTreeMap<_, _> = m.parameter_kinds().into_iter().collect();
        let n: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
        let order: Vec<String> = m.parameter_kinds().into_iter().map(|(n, _)| n).collect();
        assert_eq!(n, order);
        k
    };
    let v = kinds(&vit(DType::F32));
    assert_eq!(v["embeddings.cls_token"], LayerKind::Other);
    assert_eq!(v["embeddings.position_embeddings"], LayerKind::Other);
    assert_eq!(
        v["embeddings.patch_embeddings.projection.weight"],
        LayerKind::Conv
    );
    assert_eq!(
        v["encoder.layer.1.attention.attention.key.bias"],
        LayerKind::Linear
    );
    assert_eq!(v["encoder.layer.0.layernorm_after.weight"], LayerKind::Norm);
    assert_eq!(v["pooler.dense.weight"], LayerKind::Linear);
    let b = kinds(&bert(DType::F32));
    assert_eq!(
        b["embeddings.token_type_embeddings.weight"],
        LayerKind::Embedding
    );
    assert_eq!(b["embeddings.LayerNorm.bias"], LayerKind::Norm);
    assert_eq!(b["encoder.layer.1.output.dense.weight"], LayerKind::Linear);
    let g = kinds(&gpt2(DType::F32));
    assert_eq!(g["wte.weight"], LayerKind::Embedding);
    assert_eq!(g["wpe.weight"], LayerKind::Embedding);
    assert_eq!(g["h.0.attn.c_attn.weight"], LayerKind::Linear);
    assert_eq!(g["h.1.mlp.c_proj.bias"], LayerKind::Linear);
    assert_eq!(g["ln_f.weight"], LayerKind::Norm);
}

#[test]
fn ledger_reports_saved_bytes_by_hugging_face_layer_name() {
    let r = run(&vit, "vit_tiny", "all", SavePolicy::Lean, DType::F32);
    for l in [
        "embeddings.patch_embeddings.projection",
        "encoder.layer.0.layernorm_before",
        "encoder.layer.0.attention.attention",
        "encoder.layer.0.attention.attention.query",
        "encoder.layer.1.intermediate",
        "encoder.layer.1.output.dense",
        "layernorm",
        "pooler",
    ] {
        assert!(r.layers.contains(l), "{l} not in {:?}", r.layers);
    }
    let r = run(&bert, "bert_tiny", "all", SavePolicy::Lean, DType::F32);
    for l in [
        "embeddings.word_embeddings",
        "embeddings.LayerNorm",
        "encoder.layer.0.attention.self",
        "encoder.layer.0.attention.output.LayerNorm",
        "encoder.layer.1.output.LayerNorm",
        "pooler.dense",
    ] {
        assert!(r.layers.contains(l), "{l} not in {:?}", r.layers);
    }
    let r = run(&gpt2, "gpt2_tiny", "all", SavePolicy::Lean, DType::F32);
    for l in [
        "wte",
        "h.0.ln_1",
        "h.0.attn",
        "h.0.attn.c_attn",
        "h.1.mlp",
        "h.1.mlp.c_proj",
        "ln_f",
        "lm_head",
    ] {
        assert!(r.layers.contains(l), "{l} not in {:?}", r.layers);
    }
}

/// Full-size configurations have Hugging Face's parameter counts
/// (`sum(p.numel() for p in Model(Config()).parameters())` with
/// transformers 5.23; RoBERTa's with 5.24): ViTModel 86 389 248,
/// BertModel 109 482 240, RobertaModel 124 645 632, XLMRobertaModel
/// 278 043 648, GPT2Model 124 439 808. Built in bf16 to halve the memory.
#[test]
fn full_size_parameter_counts_match_hugging_face() {
    let count = |m: &dyn Module| -> usize { m.parameters().iter().map(|t| t.numel()).sum() };
    let d = DType::BF16;
    let m = ViT::new(ViTConfig::vit_b16(), d, CPU, 0).unwrap();
    assert_eq!(count(&m), 86_389_248);
    assert_eq!(m.named_parameters().len(), 200);
    drop(m);
    let m = Bert::new(BertConfig::bert_base(), d, CPU, 0).unwrap();
    assert_eq!(count(&m), 109_482_240);
    assert_eq!(m.named_parameters().len(), 199);
    drop(m);
    let m = Bert::new(BertConfig::roberta_base(), d, CPU, 0).unwrap();
    assert_eq!(count(&m), 124_645_632);
    assert_eq!(m.named_parameters().len(), 199);
    drop(m);
    let m = Bert::new(BertConfig::xlm_roberta_base(), d, CPU, 0).unwrap();
    assert_eq!(count(&m), 278_043_648);
    drop(m);
    let m = Gpt2::new(Gpt2Config::gpt2_small(), d, CPU, 0).unwrap();
    assert_eq!(count(&m), 124_439_808);
    assert_eq!(m.named_parameters().len(), 148);
}

#[test]
fn strict_loading_names_missing_unexpected_and_mismatched_tensors() {
    let model = gpt2(DType::F32);
    let mut sd = fixture("gpt2_tiny.safetensors");
    sd.remove("h.1.ln_2.bias");
    let extra = sd["ln_f.bias"].clone();
    sd.insert("lm_head.weight".into(), extra);
    let wrong = Tensor::zeros(&[16, 47], DType::F32, CPU).unwrap();
    sd.insert("h.0.attn.c_attn.weight".into(), wrong);
    match load_state_dict(&model, &sd, LoadOptions { strict: true }) {
        Err(Error::StateDictMismatch {
            missing,
            unexpected,
            mismatched,
            ..
        }) => {
            assert_eq!(missing, vec!["h.1.ln_2.bias".to_string()]);
            assert_eq!(unexpected, vec!["lm_head.weight".to_string()]);
            assert_eq!(mismatched.len(), 1);
            assert_eq!(mismatched[0].0, "h.0.attn.c_attn.weight");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a damaged state dict loaded"),
    }
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    let bad = ViTConfig {
        patch_size: 5,
        ..ViTConfig::tiny()
    };
    assert!(ViT::new(bad, DType::F32, CPU, 0).is_err());
    let bad = BertConfig {
        num_attention_heads: 3,
        ..BertConfig::tiny()
    };
    assert!(Bert::new(bad, DType::F32, CPU, 0).is_err());
    let model = gpt2(DType::F32);
    let long = Tensor::zeros(&[1, 17], DType::I64, CPU).unwrap();
    assert!(model.forward(&long).is_err());
    let out_of_vocab = Tensor::full(&[1, 3], 50.0, DType::I64, CPU).unwrap();
    assert!(model.forward(&out_of_vocab).is_err());
    let ids = Tensor::zeros(&[2, 4], DType::I64, CPU).unwrap();
    let mask = Tensor::ones(&[2, 5], DType::I64, CPU).unwrap();
    let b = bert(DType::F32);
    assert!(b
        .encode_masked(TextInput::Ids(&ids), None, Some(&mask))
        .is_err());
    let images = Tensor::zeros(&[1, 3, 8, 8], DType::F32, CPU).unwrap();
    assert!(vit(DType::F32).forward(&images).is_err());
}

/// transformers 5 saves ViTModel with renamed encoder modules; mapped back
/// with `classic_vit_name`, such a state dict loads strictly.
#[test]
fn transformers5_vit_names_map_to_the_classic_ones() {
    let mut v5: Vec<String> = [
        "embeddings.cls_token",
        "embeddings.position_embeddings",
        "embeddings.patch_embeddings.projection.weight",
        "embeddings.patch_embeddings.projection.bias",
        "layernorm.weight",
        "layernorm.bias",
        "pooler.dense.weight",
        "pooler.dense.bias",
    ]
    .map(String::from)
    .to_vec();
    for i in 0..2 {
        for m in [
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.o_proj",
            "layernorm_before",
            "layernorm_after",
            "mlp.fc1",
            "mlp.fc2",
        ] {
            for p in ["weight", "bias"] {
                v5.push(format!("layers.{i}.{m}.{p}"));
            }
        }
    }
    let classic = fixture("vit_tiny.safetensors");
    let mapped: BTreeSet<String> = v5.iter().map(|n| classic_vit_name(n)).collect();
    assert_eq!(mapped, classic.keys().cloned().collect::<BTreeSet<_>>());
    assert_eq!(
        classic_vit_name("layers.11.mlp.fc1.weight"),
        "encoder.layer.11.intermediate.dense.weight"
    );
    // A transformers-5 state dict (classic names renamed to v5 ones) loads
    // in one call.
    let to_v5: BTreeMap<String, String> = v5
        .iter()
        .map(|n| (classic_vit_name(n), n.clone()))
        .collect();
    let sd: BTreeMap<String, Tensor> = classic
        .into_iter()
        .map(|(n, t)| (to_v5[&n].clone(), t))
        .collect();
    let model = vit(DType::F32);
    model
        .load_hf_state_dict(&sd, LoadOptions { strict: true })
        .unwrap();
}

/// Three Adam steps on tiny GPT-2 (whose `wte` is used twice: lookup and
/// tied head): the fused path (update inside backward) gives bit-identical
/// parameters to `backward` + `step`.
#[test]
fn tied_gpt2_trains_identically_on_the_fused_path() {
    use leangrad::optim::{Adam, Optimizer};
    let io = fixture("gpt2_tiny_all.safetensors");
    let (ids, probe) = (&io["input_ids"], &io["probe"]);
    let train = |fused: bool| -> Vec<Vec<u32>> {
        let model = gpt2(DType::F32);
        load_state_dict(
            &model,
            &fixture("gpt2_tiny.safetensors"),
            LoadOptions { strict: true },
        )
        .unwrap();
        let mut opt = Optimizer::new(model.parameters(), Adam::new(1e-2)).unwrap();
        for _ in 0..3 {
            let loss = model
                .forward(ids)
                .unwrap()
                .mul(probe)
                .unwrap()
                .sum_all()
                .unwrap();
            if fused {
                opt.backward_step(&loss).unwrap();
            } else {
                loss.backward().unwrap();
                opt.step().unwrap();
                opt.zero_grad();
            }
        }
        model
            .parameters()
            .iter()
            .map(|t| {
                t.to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            })
            .collect()
    };
    let usual = train(false);
    assert_eq!(train(true), usual);
    let loaded = fixture("gpt2_tiny.safetensors")["wte.weight"]
        .to_vec::<f32>()
        .unwrap();
    assert_ne!(
        usual[0],
        loaded.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// Every block a checkpointed segment (`gradient_checkpointing(true)`):
/// the same Hugging Face fixtures hold in every case.
#[test]
fn checkpointed_tiny_models_match_hugging_face() {
    let on = |mut m: ViT| {
        m.gradient_checkpointing(true);
        m
    };
    check_model(&|d| on(vit(d)), "vit_tiny", &VIT_CASES, DType::F32, 1e-4);
    check_model(
        &|d| {
            let mut m = bert(d);
            m.gradient_checkpointing(true);
            m
        },
        "bert_tiny",
        &TEXT_CASES,
        DType::F32,
        1e-4,
    );
    check_model(
        &|d| {
            let mut m = gpt2(d);
            m.gradient_checkpointing(true);
            m
        },
        "gpt2_tiny",
        &TEXT_CASES,
        DType::F32,
        1e-4,
    );
}
