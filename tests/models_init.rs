//! Fresh models start as torchvision's and Hugging Face's constructors
//! leave them. leangrad draws from its own Philox streams, so the values
//! cannot be PyTorch's bit for bit; what is compared is, per parameter
//! (by state-dict name, every one of them), the statistics of PyTorch's
//! own freshly built twin in `tests/fixtures/init/init_stats.json`
//! (written by `python-compare/init_stats.py`):
//!
//! * a constant (BatchNorm/LayerNorm weight 1, biases 0, the zero-init
//!   residual BatchNorm weight 0) exactly;
//! * otherwise the mean and the standard deviation within 5 standard
//!   errors of the difference of two samples of those sizes (the error of
//!   a normal sample's standard deviation, σ/√(2n), is larger than a
//!   uniform one's, so it bounds both), and the rows that are all zero
//!   (BERT's padding row) exactly.
//!
//! Each model has torchvision's / the twin's layer shapes, except the VGG
//! classifiers, kept narrow here (512 → 256 → 256 → 10 instead of 25088 →
//! 4096 → 4096 → 10): their statistics do not depend on the width.

use leangrad::models::{
    AlexNet, AlexNetConfig, BertClassifier, BertConfig, BlockKind, Gpt2, Gpt2Config, MobileNetV2,
    MobileNetV2Config, ResNet, ResNetConfig, Vgg, VggConfig, ViTClassifier, ViTConfig,
};
use leangrad::nn::Module;
use leangrad::{DType, Device, Tensor};
use serde_json::Value;
use std::collections::BTreeSet;

const VGG11_PLAN: [usize; 13] = [64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0];

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/init/init_stats.json"
    );
    let text = std::fs::read_to_string(path).expect("the init statistics fixture");
    serde_json::from_str(&text).expect("valid JSON")
}

fn resnet(block: BlockKind, zero_init_residual: bool) -> ResNetConfig {
    ResNetConfig {
        block,
        layers: [1, 1, 1, 1],
        base_width: 64,
        num_classes: 10,
        in_channels: 3,
        zero_init_residual,
        groups: 1,
        width_per_group: 64,
    }
}

fn vgg(batch_norm: bool) -> VggConfig {
    VggConfig {
        plan: VGG11_PLAN.to_vec(),
        batch_norm,
        in_channels: 3,
        pool_size: 1,
        hidden: 256,
        num_classes: 10,
        dropout: 0.5,
    }
}

fn vit() -> ViTConfig {
    ViTConfig {
        hidden_size: 96,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        intermediate_size: 384,
        image_size: 64,
        patch_size: 16,
        ..ViTConfig::vit_b16()
    }
}

fn bert() -> BertConfig {
    BertConfig {
        vocab_size: 1000,
        hidden_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        intermediate_size: 512,
        max_position_embeddings: 64,
        ..BertConfig::bert_base()
    }
}

fn gpt2() -> Gpt2Config {
    Gpt2Config {
        vocab_size: 1000,
        n_positions: 64,
        n_embd: 128,
        n_layer: 4,
        n_head: 4,
        n_inner: 512,
        layer_norm_epsilon: 1e-5,
    }
}

/// The model the fixture calls `name`, built from `seed` on `device`.
fn build(name: &str, device: Device, seed: u64) -> Box<dyn Module> {
    let f = DType::F32;
    let m: leangrad::Result<Box<dyn Module>> = match name {
        "resnet_basic" => ResNet::new(resnet(BlockKind::Basic, false), f, device, seed)
            .map(|m| Box::new(m) as Box<dyn Module>),
        "resnet_bottleneck_zero_init" => {
            ResNet::new(resnet(BlockKind::Bottleneck, true), f, device, seed)
                .map(|m| Box::new(m) as Box<dyn Module>)
        }
        "resnext_bottleneck" => {
            let c = ResNetConfig {
                groups: 32,
                width_per_group: 4,
                ..resnet(BlockKind::Bottleneck, false)
            };
            ResNet::new(c, f, device, seed).map(|m| Box::new(m) as Box<dyn Module>)
        }
        "vgg11" => Vgg::new(&vgg(false), f, device, seed).map(|m| Box::new(m) as Box<dyn Module>),
        "vgg11_bn" => Vgg::new(&vgg(true), f, device, seed).map(|m| Box::new(m) as Box<dyn Module>),
        "mobilenet_v2" => MobileNetV2::new(&MobileNetV2Config::v2(10), f, device, seed)
            .map(|m| Box::new(m) as Box<dyn Module>),
        "alexnet" => AlexNet::new(&AlexNetConfig::alexnet(10), f, device, seed)
            .map(|m| Box::new(m) as Box<dyn Module>),
        "vit" => ViTClassifier::new(vit(), 5, f, device, seed).map(|m| Box::new(m) as _),
        "bert" => BertClassifier::new(bert(), 5, f, device, seed).map(|m| Box::new(m) as _),
        "gpt2" => Gpt2::new(gpt2(), f, device, seed).map(|m| Box::new(m) as _),
        other => panic!("no model {other}"),
    };
    m.unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Mean and unbiased standard deviation.
fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

fn zero_rows(t: &Tensor, v: &[f64]) -> Vec<usize> {
    if t.rank() != 2 {
        return Vec::new();
    }
    let cols = t.shape()[1];
    (0..t.shape()[0])
        .filter(|r| v[r * cols..(r + 1) * cols].iter().all(|&x| x == 0.0))
        .collect()
}

fn number(v: &Value, key: &str, what: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{what}: `{key}`"))
}

/// Every way `name`'s parameter `t` differs from PyTorch's `want`.
fn differences(name: &str, t: &Tensor, want: &Value, narrower: bool) -> Vec<String> {
    let mut out = Vec::new();
    let shape: Vec<usize> = want["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect();
    if !narrower && t.shape() != shape.as_slice() {
        out.push(format!("{name}: shape {:?}, PyTorch {shape:?}", t.shape()));
    }
    let v = t.to_f64_vec().expect("values");
    if let Some(c) = want["constant"].as_f64() {
        if let Some(x) = v.iter().find(|&&x| x != c) {
            out.push(format!("{name}: {x} where PyTorch's are all {c}"));
        }
        return out;
    }
    let (mean, std) = mean_std(&v);
    let (want_mean, want_std) = (number(want, "mean", name), number(want, "std", name));
    let (n, m) = (v.len() as f64, shape.iter().product::<usize>() as f64);
    let se_mean = want_std * (1.0 / n + 1.0 / m).sqrt();
    let se_std = want_std * (0.5 / n + 0.5 / m).sqrt();
    if (mean - want_mean).abs() > 5.0 * se_mean {
        out.push(format!(
            "{name}: mean {mean:.3e}, PyTorch {want_mean:.3e} (±{se_mean:.1e})"
        ));
    }
    if (std - want_std).abs() > 5.0 * se_std {
        out.push(format!(
            "{name}: std {std:.4e}, PyTorch {want_std:.4e} (±{se_std:.1e})"
        ));
    }
    let want_zero: Vec<usize> = want["zero_rows"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| r.as_u64().expect("row") as usize)
                .collect()
        })
        .unwrap_or_default();
    let zero = zero_rows(t, &v);
    if zero != want_zero {
        out.push(format!("{name}: zero rows {zero:?}, PyTorch {want_zero:?}"));
    }
    out
}

/// Compares every parameter of `model` with the fixture's statistics.
fn check(model: &str) {
    let fixture = fixture();
    let want = &fixture["models"][model]["params"];
    let want = want
        .as_object()
        .unwrap_or_else(|| panic!("{model} in the fixture"));
    let built = build(model, Device::Cpu, 0);
    let params = built.named_parameters();
    let names: BTreeSet<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    let want_names: BTreeSet<&str> = want.keys().map(String::as_str).collect();
    assert_eq!(names, want_names, "{model}: parameter names");
    let mut differ = Vec::new();
    for (name, t) in &params {
        let narrower = model.starts_with("vgg") && name.starts_with("classifier.");
        differ.extend(differences(name, t, &want[name.as_str()], narrower));
    }
    assert!(
        differ.is_empty(),
        "{model}: {} differences from PyTorch's init in {} parameters:\n{}",
        differ.len(),
        params.len(),
        differ.join("\n")
    );
}

#[test]
fn resnet_basic_is_initialised_as_torchvisions() {
    check("resnet_basic");
}

#[test]
fn resnet_bottleneck_with_zero_init_residual_is_initialised_as_torchvisions() {
    check("resnet_bottleneck_zero_init");
}

/// ResNeXt's grouped 3×3 convolutions draw over torchvision's fan out
/// (`out · 3 · 3`, the groups left out, as `kaiming_normal_` computes it
/// from the weight's shape).
#[test]
fn resnext_bottleneck_is_initialised_as_torchvisions() {
    check("resnext_bottleneck");
}

/// torchvision's AlexNet keeps PyTorch's default initialisation of every
/// convolution and Linear (uniform in ±1/√fan_in, weight and bias).
#[test]
fn alexnet_is_initialised_as_torchvisions() {
    check("alexnet");
}

#[test]
fn vgg_is_initialised_as_torchvisions() {
    check("vgg11");
    check("vgg11_bn");
}

#[test]
fn mobilenet_v2_is_initialised_as_torchvisions() {
    check("mobilenet_v2");
}

#[test]
fn vit_is_initialised_as_hugging_faces() {
    check("vit");
}

#[test]
fn bert_is_initialised_as_hugging_faces() {
    check("bert");
}

#[test]
fn gpt2_is_initialised_as_hugging_faces() {
    check("gpt2");
}

/// Every parameter's values, in order.
fn values(m: &dyn Module) -> Vec<(String, Vec<f64>)> {
    let params = m.named_parameters().into_iter();
    params
        .map(|(n, t)| (n, t.to_f64_vec().expect("values")))
        .collect()
}

/// A seed gives the same values every time; another seed other values
/// wherever something is drawn (not the constants).
#[test]
fn seeds_reproduce_the_initial_values() {
    for model in [
        "resnet_bottleneck_zero_init",
        "mobilenet_v2",
        "bert",
        "gpt2",
    ] {
        let a = values(&*build(model, Device::Cpu, 3));
        assert_eq!(a, values(&*build(model, Device::Cpu, 3)), "{model}");
        let b = values(&*build(model, Device::Cpu, 4));
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            let constant = x.iter().all(|v| *v == x[0]);
            assert_eq!(constant, x == y, "{model}: {name} (seed 3 vs 4)");
        }
    }
}

/// The meta device holds no data: every model builds there with the same
/// parameter names and shapes, and nothing is drawn.
#[test]
fn models_build_on_the_meta_device_with_the_same_shapes() {
    for model in [
        "resnet_basic",
        "resnext_bottleneck",
        "vgg11_bn",
        "alexnet",
        "mobilenet_v2",
        "vit",
        "bert",
        "gpt2",
    ] {
        let meta = build(model, Device::Meta, 0).named_parameters();
        let cpu = build(model, Device::Cpu, 0).named_parameters();
        assert_eq!(meta.len(), cpu.len(), "{model}");
        for ((n, m), (k, c)) in meta.iter().zip(&cpu) {
            assert_eq!((n, m.shape()), (k, c.shape()), "{model}");
            assert!(m.device().is_meta(), "{model}: {n}");
        }
    }
}

/// A Hugging Face `config.json`'s `pad_token_id` picks BERT's padding row
/// (0 when absent, as Hugging Face's default; none when `null`); that row
/// of the fresh `word_embeddings` is zero.
#[test]
fn berts_padding_row_follows_pad_token_id() {
    let dir = std::env::temp_dir().join(format!("leangrad-init-pad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = |pad: &str| {
        let path = dir.join("config.json");
        let json = format!(
            "{{\"vocab_size\": 50, \"hidden_size\": 16, \"num_hidden_layers\": 1, \
             \"num_attention_heads\": 2, \"intermediate_size\": 32, \
             \"max_position_embeddings\": 16, \"type_vocab_size\": 2{pad}}}"
        );
        std::fs::write(&path, json).unwrap();
        BertConfig::from_json_file(&path)
    };
    for (pad, want) in [
        ("", Some(0)),
        (", \"pad_token_id\": 3", Some(3)),
        (", \"pad_token_id\": null", None),
    ] {
        let cfg = config(pad).unwrap();
        assert_eq!(cfg.pad_token_id, want, "{pad}");
        let bert = leangrad::models::Bert::new(cfg, DType::F32, Device::Cpu, 0).unwrap();
        let params = bert.named_parameters().into_iter();
        let mut words = params.filter(|(n, _)| n == "embeddings.word_embeddings.weight");
        let (_, table) = words.next().expect("word_embeddings");
        let v = table.to_f64_vec().unwrap();
        assert_eq!(
            zero_rows(&table, &v),
            want.into_iter().collect::<Vec<_>>(),
            "{pad}"
        );
    }
    let bad = config(", \"pad_token_id\": \"[PAD]\"");
    assert!(
        matches!(bad, Err(leangrad::Error::ModelFile { .. })),
        "{bad:?}"
    );
    let outside = BertConfig {
        pad_token_id: Some(50),
        ..config("").unwrap()
    };
    assert!(leangrad::models::Bert::new(outside, DType::F32, Device::Cpu, 0).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
