//! `format!("{t}")` against PyTorch's `repr` (fixtures written by
//! `python-compare/display_fixture.py`): every dtype, integer-valued
//! floats, scientific notation, non-finite values, scalars, empty and meta
//! tensors, line wrapping, summarisation above 1000 elements and the
//! suffixes (`dtype=`, `device=`, `requires_grad=True`) with their wrapping.

use leangrad::io::load_safetensors;
use leangrad::{DType, Device, Tensor};
use std::path::PathBuf;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/display")
}

/// `(name, flags, PyTorch's repr)` for every block of reprs.txt.
fn cases() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(fixture_dir().join("reprs.txt")).unwrap();
    let mut out: Vec<(String, String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("### ") {
            let (name, flags) = header.split_once(' ').unwrap_or((header, ""));
            out.push((name.into(), flags.into(), String::new()));
        } else {
            let repr = &mut out.last_mut().expect("a header first").2;
            if !repr.is_empty() {
                repr.push('\n');
            }
            repr.push_str(line);
        }
    }
    out
}

#[test]
fn display_matches_pytorch_repr() {
    let tensors = load_safetensors(fixture_dir().join("tensors.safetensors")).unwrap();
    let cases = cases();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    for (name, flags, want) in cases {
        let stored = tensors[&name].clone();
        let t = match flags.as_str() {
            "meta" => Tensor::zeros(stored.shape(), stored.dtype(), Device::Meta).unwrap(),
            "requires_grad" => stored.set_requires_grad(true).unwrap(),
            _ => stored,
        };
        assert_eq!(format!("{t}"), want, "case {name}");
    }
}

/// A non-contiguous view prints its own logical order; a tensor made by a
/// recorded op says `requires_grad=True`; `{:?}` keeps its short form.
#[test]
fn views_results_and_debug() {
    let x = Tensor::from_vec(
        vec![1.5f32, -2.0, 3.25, 4.0, 0.5, 6.0],
        &[2, 3],
        Device::Cpu,
    )
    .unwrap();
    assert_eq!(
        format!("{}", x.t().unwrap()),
        "tensor([[ 1.5000,  4.0000],\n        [-2.0000,  0.5000],\n        [ 3.2500,  6.0000]])"
    );
    let w = x.clone().set_requires_grad(true).unwrap();
    let y = w.mul_scalar(2.0).unwrap();
    assert_eq!(
        format!("{y}"),
        "tensor([[ 3.0000, -4.0000,  6.5000],\n        [ 8.0000,  1.0000, 12.0000]], requires_grad=True)"
    );
    assert_eq!(format!("{x:?}"), "Tensor[[2, 3], F32, cpu]");
    let i = Tensor::arange(4, DType::U32, Device::Cpu).unwrap();
    assert_eq!(format!("{i}"), "tensor([0, 1, 2, 3], dtype=torch.uint32)");
}
