//! A tiny Mistral-style decoder (grouped-query attention with 4 query and
//! 2 key/value heads, rotary embeddings, RMSNorm, SwiGLU, a sliding window
//! of 5 over 6 tokens, right padding in the second sequence) against Hugging
//! Face's `MistralForCausalLM` (fixtures written by
//! `python-compare/export_transformers.py mistral_tiny`, reference in f64):
//! strict state-dict load, logits and every gradient of `sum(logits ·
//! probe)` for the freezing cases, with and without per-layer
//! checkpointing; the lean policy against SaveAll; Mistral-7B's parameter
//! count on the meta device; bad configurations.
//!
//! Tolerances are relative to each tensor's largest magnitude: 1e-4 in
//! f32, 1e-5 in f64. Measured worst (outputs and all gradients over all
//! cases): 6.7e-7 in f32, 2.5e-7 in f64 (Hugging Face's RMSNorm rounds to
//! f32 inside even an f64 model, and its rotary tables are f32 in every
//! dtype, as leangrad's).

mod common;
#[path = "common/hf.rs"]
mod hf;

use common::models::{fixture, CPU};
use hf::{check_model, check_policies, run, HfModel};
use leangrad::autograd::SavePolicy;
use leangrad::io::state_dict;
use leangrad::models::{Mistral, MistralConfig, TextInput};
use leangrad::nn::{LayerKind, Module};
use leangrad::{DType, Device, Tensor};
use std::collections::{BTreeMap, BTreeSet};

const CASES: [&str; 6] = [
    "all",
    "input",
    "norm",
    "linear",
    "surgical-first",
    "surgical-last",
];

impl HfModel for Mistral {
    fn freeze(&mut self, want: &dyn Fn(&str) -> bool) {
        self.set_requires_grad(want).unwrap();
    }
    fn outputs(&self, x: Option<&Tensor>, io: &BTreeMap<String, Tensor>) -> Vec<(String, Tensor)> {
        let input = match x {
            Some(e) => TextInput::Embeds(e),
            None => TextInput::Ids(&io["input_ids"]),
        };
        let mask = io.get("attention_mask");
        vec![("output".into(), self.logits(input, mask).unwrap())]
    }
}

fn tiny(d: DType) -> Mistral {
    Mistral::new(MistralConfig::tiny(), d, CPU, 1).unwrap()
}

#[test]
fn tiny_mistral_matches_hugging_face_f32_and_f64() {
    check_model(&tiny, "mistral_tiny", &CASES, DType::F32, 1e-4);
    check_model(&tiny, "mistral_tiny", &CASES, DType::F64, 1e-5);
}

#[test]
fn checkpointed_layers_match_hugging_face() {
    let on = |d| {
        let mut m = tiny(d);
        m.gradient_checkpointing(true);
        m
    };
    check_model(&on, "mistral_tiny", &CASES, DType::F32, 1e-4);
}

#[test]
fn lean_policy_saves_less_with_bit_identical_gradients() {
    let bytes = check_policies(&tiny, "mistral_tiny", &CASES);
    // Where every parameter learns, the lean policy keeps strictly less:
    // no silu(gate), no repeated keys and values, no rotation tables.
    let all = bytes.iter().find(|(c, ..)| c == "all").unwrap();
    assert!(all.1 < all.2, "{all:?}");
    println!("mistral_tiny saved bytes (case, lean, SaveAll): {bytes:?}");
}

#[test]
fn names_and_kinds_are_hugging_faces() {
    let m = tiny(DType::F32);
    let names: BTreeSet<String> = state_dict(&m, "").into_iter().map(|(n, _)| n).collect();
    let file: BTreeSet<String> = fixture("mistral_tiny.safetensors").into_keys().collect();
    assert_eq!(names, file);
    let k: BTreeMap<_, _> = m.parameter_kinds().into_iter().collect();
    assert_eq!(k["model.embed_tokens.weight"], LayerKind::Embedding);
    assert_eq!(
        k["model.layers.1.self_attn.k_proj.weight"],
        LayerKind::Linear
    );
    assert_eq!(k["model.layers.0.mlp.gate_proj.weight"], LayerKind::Linear);
    assert_eq!(
        k["model.layers.0.post_attention_layernorm.weight"],
        LayerKind::Norm
    );
    assert_eq!(k["model.norm.weight"], LayerKind::Norm);
    assert_eq!(k["lm_head.weight"], LayerKind::Linear);
}

/// `sum(p.numel() for p in MistralForCausalLM(config).parameters())` with
/// transformers 5.24 (built on PyTorch's meta device): 7 241 732 096 in
/// 291 tensors. Built here on the meta device too (no bytes).
#[test]
fn mistral_7b_has_hugging_faces_parameter_count() {
    let cfg = MistralConfig::mistral_7b();
    assert_eq!(cfg.parameter_count(), Some(7_241_732_096));
    let m = Mistral::new(cfg, DType::BF16, Device::Meta, 0).unwrap();
    let params = m.named_parameters();
    assert_eq!(params.len(), 291);
    let total: usize = params.iter().map(|(_, t)| t.numel()).sum();
    assert_eq!(total, 7_241_732_096);
    let tied = MistralConfig {
        tie_word_embeddings: true,
        ..MistralConfig::tiny()
    };
    let m = Mistral::new(tied, DType::F32, CPU, 0).unwrap();
    let total: usize = m.named_parameters().iter().map(|(_, t)| t.numel()).sum();
    assert_eq!(Some(total), tied.parameter_count());
    assert!(!m
        .named_parameters()
        .iter()
        .any(|(n, _)| n == "lm_head.weight"));
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    let tiny_cfg = MistralConfig::tiny();
    for bad in [
        MistralConfig {
            num_key_value_heads: 3,
            ..tiny_cfg
        },
        MistralConfig {
            head_dim: 7,
            ..tiny_cfg
        },
        MistralConfig {
            sliding_window: Some(0),
            ..tiny_cfg
        },
        MistralConfig {
            rope_theta: -1.0,
            ..tiny_cfg
        },
    ] {
        assert!(Mistral::new(bad, DType::F32, CPU, 0).is_err(), "{bad:?}");
    }
    let m = tiny(DType::F32);
    let long = Tensor::zeros(&[1, 33], DType::I64, CPU).unwrap();
    assert!(m.forward(&long).is_err());
    let out_of_vocab = Tensor::full(&[1, 3], 64.0, DType::I64, CPU).unwrap();
    assert!(m.forward(&out_of_vocab).is_err());
    let ids = Tensor::zeros(&[2, 4], DType::I64, CPU).unwrap();
    let mask = Tensor::ones(&[2, 5], DType::I64, CPU).unwrap();
    assert!(m.logits(TextInput::Ids(&ids), Some(&mask)).is_err());
}

#[test]
fn ledger_reports_saved_bytes_by_hugging_face_layer_name() {
    let r = run(&tiny, "mistral_tiny", "all", SavePolicy::Lean, DType::F32);
    for l in [
        "model.embed_tokens",
        "model.layers.0.input_layernorm",
        "model.layers.0.self_attn",
        "model.layers.0.self_attn.o_proj",
        "model.layers.1.mlp",
        "model.layers.1.mlp.down_proj",
        "model.norm",
        "lm_head",
    ] {
        assert!(r.layers.contains(l), "{l} not in {:?}", r.layers);
    }
    // The rotations keep nothing.
    assert!(
        !r.layers.iter().any(|l| l.contains("rotary_emb")),
        "{:?}",
        r.layers
    );
}

/// A folder as Hugging Face writes one: `config.json` (transformers 5's
/// `rope_parameters`) and the weights, whole or in two shards with their
/// index; `from_pretrained` gives the fixture's logits either way.
#[test]
fn from_pretrained_reads_whole_and_sharded_folders() {
    let dir = std::env::temp_dir().join(format!("leangrad-mistral-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = r#"{"model_type": "mistral", "architectures": ["MistralForCausalLM"],
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "max_position_embeddings": 32, "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": 5, "tie_word_embeddings": false, "hidden_act": "silu"}"#;
    std::fs::write(dir.join("config.json"), config).unwrap();
    let io = fixture("mistral_tiny_input.safetensors");
    let logits = |m: &Mistral| {
        let x = TextInput::Embeds(&io["input"]);
        m.logits(x, Some(&io["attention_mask"])).unwrap()
    };
    let want = io["output"].to_f64_vec().unwrap();
    let check = |m: &Mistral| {
        let got = logits(m).to_f64_vec().unwrap();
        let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
        let err = got
            .iter()
            .zip(&want)
            .fold(0f64, |a, (g, w)| a.max((g - w).abs()));
        assert!(err <= 1e-4 * scale, "{err} against {scale}");
    };
    let weights: Vec<(String, Tensor)> = fixture("mistral_tiny.safetensors").into_iter().collect();
    leangrad::io::save_safetensors(dir.join("model.safetensors"), &weights).unwrap();
    check(&Mistral::from_pretrained(&dir, DType::F32, CPU).unwrap());
    // Two shards and their index, as `save_pretrained(max_shard_size=…)`.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let (a, b) = weights.split_at(weights.len() / 2);
    let mut map = serde_json::Map::new();
    for (shard, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        leangrad::io::save_safetensors(dir.join(shard), part).unwrap();
        for (n, _) in part {
            map.insert(n.clone(), shard.into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    check(&Mistral::from_pretrained(&dir, DType::F32, CPU).unwrap());
    // An index that points outside the folder is refused.
    let escape = serde_json::json!({"weight_map": {"lm_head.weight": "../x.safetensors"}});
    std::fs::write(dir.join("model.safetensors.index.json"), escape.to_string()).unwrap();
    let e = Mistral::from_pretrained(&dir, DType::F32, CPU)
        .err()
        .unwrap();
    assert!(matches!(e, leangrad::Error::ModelFile { .. }), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `config.json` files the decoder cannot be: each refused by name.
#[test]
fn bad_config_files_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("leangrad-mistral-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    let base = r#""vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 32"#;
    let read = |extra: &str| {
        std::fs::write(&path, format!("{{{base}{extra}}}")).unwrap();
        MistralConfig::from_json_file(&path)
    };
    // Llama's: no sliding window, key/value heads default to the heads.
    let llama = read(r#", "model_type": "llama", "rope_theta": 500000.0"#).unwrap();
    assert_eq!(llama.num_key_value_heads, 4);
    assert_eq!(
        (llama.head_dim, llama.sliding_window, llama.rope_theta),
        (8, None, 5e5)
    );
    for (extra, says) in [
        (r#", "model_type": "qwen2""#, "model_type"),
        (r#", "hidden_act": "gelu""#, "hidden_act"),
        (r#", "attention_bias": true"#, "attention_bias"),
        (r#", "num_key_value_heads": 3"#, "decoder"),
        (
            r#", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#,
            "yarn",
        ),
        (r#", "vocab_size": 0"#, "vocab_size"),
        (r#", "sliding_window": -1"#, "sliding_window"),
        (r#", "rms_norm_eps": "small""#, "rms_norm_eps"),
    ] {
        let e = read(extra).err().unwrap();
        assert!(e.to_string().contains(says), "{extra}: {e}");
        assert!(e.to_string().contains("config.json"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
