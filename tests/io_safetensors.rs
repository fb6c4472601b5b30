//! Weight files: safetensors round trips, PyTorch state-dict fixtures
//! (written by `python-compare/state_dict_fixture.py`), state-dict
//! mismatches, and damaged files.

mod common;

use common::assert_close;
use leangrad::io::{
    load_safetensors, load_safetensors_bytes, load_state_dict, load_state_dict_of,
    save_safetensors, serialize_safetensors, state_dict, state_dict_of, LoadOptions,
};
use leangrad::memory::Ledger;
use leangrad::nn::MultiheadAttention;
use leangrad::nn::{BatchNorm, Conv2d, Linear, Module};
use leangrad::{DType, Device, Error, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

const ALL: [DType; 7] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F64,
    DType::U8,
    DType::U32,
    DType::I64,
];

fn fixture(name: &str) -> BTreeMap<String, Tensor> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("run under cargo");
    let path = PathBuf::from(dir)
        .join("tests/fixtures/state_dicts")
        .join(name);
    load_safetensors(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Loads `<name>.safetensors` (or `file`) into `module` and checks its
/// output on the fixture's input against PyTorch's.
fn check_fixture(module: &dyn Module, name: &str, file: &str, tol: f64) {
    let io = fixture(&format!("{name}_io.safetensors"));
    let dtype = module.parameters()[0].dtype();
    let x = io["input"].to_dtype(dtype).unwrap();
    // Control: before loading, the output is not PyTorch's.
    let fresh = module.forward(&x).unwrap().to_f64_vec().unwrap();
    let want = io["output"].to_f64_vec().unwrap();
    assert!(fresh.iter().zip(&want).any(|(a, b)| (a - b).abs() > 0.1));
    let report = load_state_dict(module, &fixture(file), LoadOptions::default()).unwrap();
    assert!(report.missing.is_empty() && report.unexpected.is_empty());
    let y = module.forward(&x).unwrap();
    assert_eq!(y.shape(), io["output"].shape());
    assert_close(
        &y.to_f64_vec().unwrap(),
        &io["output"].to_f64_vec().unwrap(),
        tol,
    );
}

fn values(m: &dyn Module) -> Vec<(String, Vec<f64>, u64)> {
    state_dict(m, "")
        .into_iter()
        .map(|(n, t)| (n, t.to_f64_vec().unwrap(), t.version()))
        .collect()
}

fn linear(dtype: DType) -> Linear {
    Linear::builder(4, 3)
        .name("fc")
        .dtype(dtype)
        .seed(7)
        .build(&Device::Cpu)
        .unwrap()
}

#[test]
fn every_dtype_round_trips_exactly_from_non_contiguous_views() {
    let dir = std::env::temp_dir().join(format!("leangrad-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut tensors = Vec::new();
    for (i, &dtype) in ALL.iter().enumerate() {
        let v: Vec<f64> = (0..12).map(|k| (k * 7 % 12) as f64 * 1.5 + 1.0).collect();
        let base = Tensor::from_f64_slice(&v, &[3, 4], dtype, Device::Cpu).unwrap();
        let t = base.t().unwrap();
        assert!(!t.is_contiguous());
        tensors.push((format!("t{i}"), t));
        tensors.push((format!("n{i}"), base.narrow(1, 1, 2).unwrap()));
        tensors.push((
            format!("s{i}"),
            Tensor::scalar(3.0, dtype, Device::Cpu).unwrap(),
        ));
    }
    let path = dir.join("all.safetensors");
    save_safetensors(&path, &tensors).unwrap();
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let from_file = load_safetensors(&path).unwrap();
    let from_bytes = load_safetensors_bytes(&serialize_safetensors(&tensors).unwrap()).unwrap();
    assert!(ledger.live(Device::Cpu) > 0, "loaded tensors are counted");
    for loaded in [&from_file, &from_bytes] {
        assert_eq!(loaded.len(), tensors.len());
        for (name, t) in &tensors {
            let back = &loaded[name];
            assert_eq!(
                (back.dtype(), back.shape()),
                (t.dtype(), t.shape()),
                "{name}"
            );
            assert!(back.is_contiguous());
            assert_eq!(
                back.to_f64_vec().unwrap(),
                t.to_f64_vec().unwrap(),
                "{name}"
            );
        }
    }
    let bits = Tensor::from_vec(
        vec![f32::NAN, -0.0, f32::MIN_POSITIVE / 4.0],
        &[3],
        Device::Cpu,
    )
    .unwrap();
    let back =
        load_safetensors_bytes(&serialize_safetensors(&[("x".into(), bits.clone())]).unwrap())
            .unwrap();
    let as_bits = |t: &Tensor| {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(as_bits(&back["x"]), as_bits(&bits));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn duplicate_names_are_refused() {
    let t = Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap();
    let r = serialize_safetensors(&[("a".into(), t.clone()), ("a".into(), t)]);
    assert_err!(r, InvalidArgument);
}

#[test]
fn pytorch_linear_f32_and_bf16() {
    check_fixture(&linear(DType::F32), "linear", "linear.safetensors", 1e-5);
    check_fixture(&linear(DType::F64), "linear", "linear.safetensors", 1e-5);
    check_fixture(
        &linear(DType::F32),
        "linear",
        "linear_bf16.safetensors",
        1e-2,
    );
    check_fixture(
        &linear(DType::F64),
        "linear",
        "linear_bf16.safetensors",
        1e-2,
    );
}

#[test]
fn pytorch_conv2d() {
    let conv = Conv2d::builder(2, 3, 3)
        .name("conv")
        .seed(1)
        .build(&Device::Cpu)
        .unwrap();
    check_fixture(&conv, "conv2d", "conv2d.safetensors", 1e-5);
}

#[test]
fn pytorch_batchnorm2d_running_stats() {
    let mut bn = BatchNorm::builder(3)
        .name("bn")
        .build2d(&Device::Cpu)
        .unwrap();
    bn.set_training(false);
    check_fixture(&bn, "batchnorm2d", "batchnorm2d.safetensors", 1e-5);
    let n = bn.num_batches_tracked.as_ref().unwrap();
    assert_eq!((n.dtype(), n.to_scalar().unwrap()), (DType::I64, 1.0));
}

#[test]
fn pytorch_multihead_attention() {
    let mut mha = MultiheadAttention::builder(8, 2)
        .name("mha")
        .seed(3)
        .build(&Device::Cpu)
        .unwrap();
    mha.set_training(false);
    check_fixture(&mha, "mha", "mha.safetensors", 1e-5);
}

#[test]
fn composite_models_prefix_names() {
    let fc = linear(DType::F32);
    let mut bn = BatchNorm::builder(3)
        .name("bn")
        .build2d(&Device::Cpu)
        .unwrap();
    bn.set_training(false);
    let children: [(&str, &dyn Module); 2] = [("head.0", &fc), ("layer1.0.bn1", &bn)];
    let names: Vec<String> = state_dict_of(&children)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "head.0.weight",
            "head.0.bias",
            "layer1.0.bn1.weight",
            "layer1.0.bn1.bias",
            "layer1.0.bn1.running_mean",
            "layer1.0.bn1.running_var",
            "layer1.0.bn1.num_batches_tracked",
        ]
    );
    let mut file = BTreeMap::new();
    for (prefix, name) in [("head.0", "linear"), ("layer1.0.bn1", "batchnorm2d")] {
        for (k, t) in fixture(&format!("{name}.safetensors")) {
            file.insert(format!("{prefix}.{k}"), t);
        }
    }
    let report = load_state_dict_of(&children, &file, LoadOptions::default()).unwrap();
    assert_eq!(report.loaded.len(), 7);
    let io = fixture("linear_io.safetensors");
    let y = fc.forward(&io["input"]).unwrap();
    assert_close(
        &y.to_f64_vec().unwrap(),
        &io["output"].to_f64_vec().unwrap(),
        1e-5,
    );
    // A module's own state dict loads into itself (source and destination
    // share storage).
    let own: BTreeMap<String, Tensor> = state_dict(&fc, "").into_iter().collect();
    let before = values(&fc);
    load_state_dict(&fc, &own, LoadOptions::default()).unwrap();
    assert_eq!(values(&fc)[0].1, before[0].1);
    // A saved state dict loads back into a fresh model.
    let bytes = serialize_safetensors(&state_dict_of(&children)).unwrap();
    let fresh = linear(DType::F32);
    let fresh_bn = BatchNorm::builder(3)
        .name("bn")
        .build2d(&Device::Cpu)
        .unwrap();
    let fresh_children: [(&str, &dyn Module); 2] =
        [("head.0", &fresh), ("layer1.0.bn1", &fresh_bn)];
    let loaded = load_safetensors_bytes(&bytes).unwrap();
    load_state_dict_of(&fresh_children, &loaded, LoadOptions::default()).unwrap();
    let strip =
        |v: Vec<(String, Vec<f64>, u64)>| v.into_iter().map(|(n, x, _)| (n, x)).collect::<Vec<_>>();
    assert_eq!(strip(values(&fresh)), strip(values(&fc)));
    assert_eq!(strip(values(&fresh_bn)), strip(values(&bn)));
}

#[test]
fn every_problem_is_reported_together_and_nothing_is_written() {
    let fc = linear(DType::F32);
    let before = values(&fc);
    let mut file = fixture("linear.safetensors");
    file.remove("bias");
    file.insert(
        "weight".into(),
        Tensor::zeros(&[3, 5], DType::F32, Device::Cpu).unwrap(),
    );
    file.insert(
        "extra.b".into(),
        Tensor::zeros(&[1], DType::F32, Device::Cpu).unwrap(),
    );
    file.insert(
        "extra.a".into(),
        Tensor::zeros(&[1], DType::F32, Device::Cpu).unwrap(),
    );
    let err = load_state_dict(&fc, &file, LoadOptions::default()).unwrap_err();
    let text = err.to_string();
    match err {
        Error::StateDictMismatch {
            missing,
            unexpected,
            mismatched,
            wrong_dtype,
            ..
        } => {
            assert_eq!(missing, ["bias"]);
            assert_eq!(unexpected, ["extra.a", "extra.b"]);
            assert_eq!(mismatched, [("weight".to_string(), vec![3, 4], vec![3, 5])]);
            assert!(wrong_dtype.is_empty());
        }
        e => panic!("unexpected error {e}"),
    }
    for needle in [
        "1 missing, 2 unexpected, 1 of another shape",
        "missing from the file: bias",
        "not in the model: extra.a, extra.b",
        "[3, 5]",
    ] {
        assert!(text.contains(needle), "{text}");
    }
    assert_eq!(values(&fc), before, "nothing written on a strict failure");
    // Non-strict still refuses a shape mismatch, and still writes nothing.
    let lax = LoadOptions { strict: false };
    let err = load_state_dict(&fc, &file, lax).unwrap_err();
    assert!(matches!(&err, Error::StateDictMismatch { mismatched, .. } if mismatched.len() == 1));
    assert_eq!(values(&fc), before);
    // Non-strict with right shapes: missing and unexpected are only reported.
    file.insert(
        "weight".into(),
        fixture("linear.safetensors")["weight"].clone(),
    );
    let report = load_state_dict(&fc, &file, lax).unwrap();
    assert_eq!(report.loaded, ["weight"]);
    assert_eq!(report.missing, ["bias"]);
    assert_eq!(report.unexpected, ["extra.a", "extra.b"]);
    let after = values(&fc);
    assert_eq!(after[1], before[1], "bias untouched");
    assert_ne!(after[0].1, before[0].1, "weight loaded");
    assert!(after[0].2 > before[0].2, "in-place load bumps the version");
}

#[test]
fn integer_tensor_into_float_parameter_is_an_error() {
    let fc = linear(DType::F32);
    let before = values(&fc);
    let mut file = fixture("linear.safetensors");
    file.insert(
        "weight".into(),
        Tensor::zeros(&[3, 4], DType::I64, Device::Cpu).unwrap(),
    );
    match load_state_dict(&fc, &file, LoadOptions::default()) {
        Err(Error::StateDictMismatch { wrong_dtype, .. }) => {
            assert_eq!(
                wrong_dtype,
                [("weight".to_string(), DType::F32, DType::I64)]
            );
        }
        r => panic!("expected a dtype mismatch, got {r:?}"),
    }
    assert_eq!(values(&fc), before);
}
