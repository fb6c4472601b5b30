//! `nn::Sequential` against `torch.nn.Sequential(Linear(4, 8), ReLU(),
//! Linear(8, 3))` (fixture written by `python-compare/surgery_fixture.py`,
//! reference in f64): PyTorch's state-dict names load strictly, and the
//! output and every gradient of `sum(output · probe)` match; plus indexing,
//! replacement and training mode through the children.

use leangrad::io::{load_safetensors, load_state_dict, state_dict, LoadOptions};
use leangrad::nn::{BatchNorm, Dropout, Linear, Module, ReLU, Sequential};
use leangrad::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    let scale = w.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
    for (a, b) in g.iter().zip(&w) {
        assert!((a - b).abs() <= 1e-5 * scale, "{what}: {a} vs {b}");
    }
}

fn mlp() -> Sequential {
    let cpu = Device::Cpu;
    Sequential::new()
        .with(Linear::builder(4, 8).seed(1).build(&cpu).unwrap())
        .with(ReLU { inplace: false })
        .with(Linear::builder(8, 3).seed(2).build(&cpu).unwrap())
}

#[test]
fn sequential_matches_torch_nn_sequential() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/surgery/sequential.safetensors");
    let fx = load_safetensors(path).unwrap();
    let sd: BTreeMap<String, Tensor> = fx
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("state.").map(|k| (k.to_string(), v.clone())))
        .collect();
    let model = mlp();
    let names: Vec<String> = state_dict(&model, "").into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
    assert_eq!(sd.keys().collect::<Vec<_>>().len(), 4);
    load_state_dict(&model, &sd, LoadOptions::default()).unwrap();
    let x = fx["input"].clone().set_requires_grad(true).unwrap();
    let y = model.forward(&x).unwrap();
    close("output", &y, &fx["output"]);
    y.mul(&fx["probe"])
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    close("grad.input", &x.grad().unwrap(), &fx["grad.input"]);
    for (name, p) in model.named_parameters() {
        close(&name, &p.grad().unwrap(), &fx[&format!("grad.{name}")]);
    }
}

#[test]
fn indexing_replacing_and_training_mode_reach_the_children() {
    let mut seq = mlp();
    assert_eq!((seq.len(), seq.is_empty()), (3, false));
    assert_eq!(seq[0].named_parameters()[0].1.shape(), &[8, 4]);
    assert!(seq[1].named_parameters().is_empty());
    assert!(seq.get(3).is_none());
    assert_eq!(seq.iter().count(), 3);
    // seq[2] = nn.Linear(8, 5)
    let head = Linear::builder(8, 5).build(&Device::Cpu).unwrap();
    let old = seq.replace(2, Box::new(head)).ok().unwrap();
    assert_eq!(old.named_parameters()[0].1.shape(), &[3, 8]);
    assert!(seq.replace(9, Box::new(ReLU { inplace: false })).is_err());
    let x = Tensor::randn(&[2, 4], DType::F32, Device::Cpu, 0).unwrap();
    assert_eq!(seq.forward(&x).unwrap().shape(), &[2, 5]);
    // An empty Sequential is the identity.
    let id = Sequential::new().forward(&x).unwrap();
    assert_eq!(id.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    // Buffers and kinds carry the index; set_training reaches Dropout.
    let mut net = Sequential::new();
    net.push(BatchNorm::builder(4).build1d(&Device::Cpu).unwrap());
    net.push(Dropout::new("drop", 0.5, 0).unwrap());
    let buffers: Vec<String> = net.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert!(
        buffers.contains(&"0.running_mean".to_string()),
        "{buffers:?}"
    );
    assert_eq!(net.parameter_kinds()[0].0, "0.weight");
    net.set_training(false);
    let y = net
        .forward(&Tensor::ones(&[2, 4], DType::F32, Device::Cpu).unwrap())
        .unwrap();
    // Eval-mode BatchNorm with fresh statistics, and no dropout: (1 − 0)/√(1 + 1e-5).
    let want = 1.0 / (1.0f64 + 1e-5).sqrt();
    assert!(y
        .to_f64_vec()
        .unwrap()
        .iter()
        .all(|v| (v - want).abs() < 1e-6));
}
