//! Bilinear interpolation (`nn::interpolate_bilinear`,
//! `nn::interpolate_bilinear_scale`, `nn::Upsample`) against PyTorch's CPU
//! kernels bit for bit (`python-compare/interpolate_fixture.py`: outputs
//! and input gradients in f32 and f64 for every case, f16 and bf16 for a
//! few, both `align_corners`, both of PyTorch's kernels, contiguous,
//! transposed and channels-last inputs, sizes and scale factors), its
//! gradient by central differences in f64, what it saves (nothing), and
//! its errors.

use leangrad::autograd::gradcheck::{gradcheck, GradcheckOptions};
use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::memory::{Category, Ledger};
use leangrad::nn::{
    interpolate_bilinear, interpolate_bilinear_scale, Module, Upsample, UpsampleSize,
};
use leangrad::{DType, Device, Error, Tensor};
use std::collections::BTreeMap;

/// How a case's input is laid out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// Contiguous NCHW.
    Nchw,
    /// The transpose of the last two dims of the stored tensor.
    Transposed,
    /// A channels-last (NHWC) tensor viewed as NCHW.
    ChannelsLast,
}

/// One fixture case: name, the stored input's shape, the output size or
/// scale factor, the layout, and whether f16/bf16 are in the fixture. In
/// step with CASES in `python-compare/interpolate_fixture.py`.
struct Case {
    name: &'static str,
    size: Option<[usize; 2]>,
    factor: Option<[f64; 2]>,
    layout: Layout,
    halves: bool,
}

const fn case(
    name: &'static str,
    size: Option<[usize; 2]>,
    factor: Option<[f64; 2]>,
    layout: Layout,
    halves: bool,
) -> Case {
    Case {
        name,
        size,
        factor,
        layout,
        halves,
    }
}

const CASES: [Case; 16] = [
    case("up2", None, Some([2.0, 2.0]), Layout::Nchw, true),
    case("odd", Some([11, 13]), None, Layout::Nchw, false),
    case("down", Some([5, 4]), None, Layout::Nchw, false),
    case("aspp", Some([7, 9]), None, Layout::Nchw, true),
    case("aspp_wide", Some([3, 126]), None, Layout::Nchw, false),
    case("lanes", Some([9, 7]), None, Layout::Nchw, false),
    case("lanes_half", Some([7, 5]), None, Layout::Nchw, true),
    case("same", Some([6, 15]), None, Layout::Nchw, false),
    case("scale", None, Some([1.7, 2.3]), Layout::Nchw, false),
    case("scale_down", None, Some([0.5, 0.75]), Layout::Nchw, false),
    case("wide", Some([4, 125]), None, Layout::Nchw, true),
    case("wide_c3", Some([3, 126]), None, Layout::Nchw, false),
    case("wide_down", Some([3, 126]), None, Layout::Nchw, false),
    case("wide_scale", None, Some([1.7, 13.5]), Layout::Nchw, false),
    case(
        "wide_transposed",
        Some([5, 124]),
        None,
        Layout::Transposed,
        false,
    ),
    case(
        "wide_channels_last",
        Some([3, 126]),
        None,
        Layout::ChannelsLast,
        false,
    ),
];

fn fixture() -> BTreeMap<String, Tensor> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/interpolate/bilinear.safetensors");
    leangrad::io::load_safetensors(path).unwrap()
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// The case's interpolation of `x` (an NCHW view).
fn run(c: &Case, x: &Tensor, align: bool) -> leangrad::Result<Tensor> {
    match (c.size, c.factor) {
        (Some(size), _) => interpolate_bilinear(x, size, align),
        (None, Some(f)) => interpolate_bilinear_scale(x, f, align),
        (None, None) => unreachable!(),
    }
}

/// PyTorch's outputs and input gradients, bit for bit, for every case,
/// dtype and `align_corners`. The probe reaches backward exactly (the
/// gradient of Σ y·g with respect to y is g).
#[test]
fn outputs_and_gradients_equal_pytorch_bit_for_bit() {
    let fx = fixture();
    let get = |k: &str| fx.get(k).unwrap_or_else(|| panic!("fixture {k}")).clone();
    let mut checked = 0;
    for c in &CASES {
        for dtype in ["f32", "f64", "f16", "bf16"] {
            if !c.halves && (dtype == "f16" || dtype == "bf16") {
                continue;
            }
            let x = get(&format!("{}.{dtype}.x", c.name));
            for align in [false, true] {
                let what = format!("{} {dtype} align_corners={align}", c.name);
                let key = format!("{}.{dtype}.a{}", c.name, u8::from(align));
                // The leaf in the case's layout, and its NCHW view.
                let leaf = match c.layout {
                    Layout::ChannelsLast => x.permute(&[0, 2, 3, 1]).unwrap().contiguous().unwrap(),
                    _ => x.clone(),
                }
                .set_requires_grad(true)
                .unwrap();
                let input = match c.layout {
                    Layout::Nchw => leaf.clone(),
                    Layout::Transposed => leaf.transpose(2, 3).unwrap(),
                    Layout::ChannelsLast => leaf.permute(&[0, 3, 1, 2]).unwrap(),
                };
                let y = run(c, &input, align).unwrap();
                let want = get(&format!("{key}.y"));
                assert_eq!(y.shape(), want.shape(), "{what}: shape");
                assert_eq!(bits(&y), bits(&want), "{what}: output");
                let g = get(&format!("{key}.g"));
                y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
                let grad = leaf.grad().expect("input gradient");
                let grad = match c.layout {
                    Layout::ChannelsLast => grad.permute(&[0, 3, 1, 2]).unwrap(),
                    _ => grad,
                };
                assert_eq!(
                    bits(&grad),
                    bits(&get(&format!("{key}.gx"))),
                    "{what}: gradient"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 2 * (2 * CASES.len() + 2 * 4));
}

/// `Upsample` is the functional op under its scope.
#[test]
fn upsample_is_the_functional_op() {
    let x = Tensor::rand_range(&[2, 3, 4, 5], -1.0, 1.0, DType::F32, Device::Cpu, 3).unwrap();
    let by_size = Upsample::new("up", UpsampleSize::Size([7, 9]), true);
    assert_eq!(
        bits(&by_size.forward(&x).unwrap()),
        bits(&interpolate_bilinear(&x, [7, 9], true).unwrap())
    );
    let by_factor = Upsample::new("up", UpsampleSize::ScaleFactor([2.5, 1.5]), false);
    let y = by_factor.forward(&x).unwrap();
    assert_eq!(y.shape(), &[2, 3, 10, 7]);
    assert_eq!(
        bits(&y),
        bits(&interpolate_bilinear_scale(&x, [2.5, 1.5], false).unwrap())
    );
    assert!(by_factor.named_parameters().is_empty());
}

/// Central differences in f64 through both of PyTorch's formulas (small
/// and large outputs), both `align_corners`, scale factors, 1×1 inputs
/// and a transposed input.
#[test]
fn gradcheck_in_f64() {
    let x = Tensor::rand_range(&[1, 2, 4, 3], -1.0, 1.0, DType::F64, Device::Cpu, 5).unwrap();
    for align in [false, true] {
        for size in [[7, 5], [2, 2], [3, 127], [4, 3]] {
            gradcheck(
                |t| interpolate_bilinear(&t[0], size, align),
                std::slice::from_ref(&x),
                GradcheckOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{size:?} align {align}: {e}"));
        }
        gradcheck(
            |t| interpolate_bilinear_scale(&t[0], [1.7, 0.8], align),
            std::slice::from_ref(&x),
            GradcheckOptions::default(),
        )
        .unwrap();
        gradcheck(
            |t| interpolate_bilinear(&t[0].transpose(2, 3)?, [6, 9], align),
            std::slice::from_ref(&x),
            GradcheckOptions::default(),
        )
        .unwrap();
    }
    let pooled = Tensor::rand_range(&[2, 5, 1, 1], -1.0, 1.0, DType::F64, Device::Cpu, 6).unwrap();
    gradcheck(
        |t| interpolate_bilinear(&t[0], [7, 9], false),
        &[pooled],
        GradcheckOptions::default(),
    )
    .unwrap();
}

/// Nothing is saved under either policy; backward allocates only the input
/// gradient.
#[test]
fn saves_nothing() {
    for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let _p = with_save_policy(policy);
        let x = Tensor::rand_range(&[2, 3, 5, 6], -1.0, 1.0, DType::F32, Device::Cpu, 1)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let y = interpolate_bilinear(&x, [70, 71], false).unwrap();
        assert_eq!(
            ledger.live_in(Device::Cpu, Category::Saved),
            0,
            "{policy:?}"
        );
        y.sum_all().unwrap().backward().unwrap();
        assert_eq!(x.grad().unwrap().shape(), x.shape());
    }
}

/// Bad arguments are typed errors, never panics.
#[test]
fn bad_arguments_are_errors() {
    let z = |shape: &[usize], dtype| Tensor::zeros(shape, dtype, Device::Cpu).unwrap();
    let x = z(&[1, 2, 3, 4], DType::F32);
    let invalid = |r: leangrad::Result<Tensor>, what: &str| {
        let e = r.expect_err(what);
        assert!(matches!(e, Error::InvalidArgument { .. }), "{what}: {e}");
    };
    invalid(
        interpolate_bilinear(&z(&[2, 3, 4], DType::F32), [2, 2], false),
        "rank 3",
    );
    invalid(
        interpolate_bilinear(&z(&[1, 1, 2, 3, 4], DType::F32), [2, 2], false),
        "rank 5",
    );
    invalid(interpolate_bilinear(&x, [0, 3], false), "zero height");
    invalid(interpolate_bilinear(&x, [3, 0], true), "zero width");
    invalid(
        interpolate_bilinear(&z(&[1, 0, 3, 4], DType::F32), [2, 2], false),
        "no channels",
    );
    invalid(
        interpolate_bilinear(&z(&[1, 2, 0, 4], DType::F32), [2, 2], false),
        "empty input",
    );
    invalid(
        interpolate_bilinear(&x, [usize::MAX / 2, 3], false),
        "overflow",
    );
    invalid(
        interpolate_bilinear(&x, [1 << 31, 1 << 31], false),
        "past i64",
    );
    for f in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        invalid(
            interpolate_bilinear_scale(&x, [f, 1.0], false),
            "bad factor",
        );
    }
    invalid(
        interpolate_bilinear_scale(&x, [0.2, 1.0], false),
        "empty output",
    );
    invalid(
        interpolate_bilinear_scale(&x, [1e300, 1.0], false),
        "huge factor",
    );
    invalid(
        interpolate_bilinear_scale(&z(&[3, 4], DType::F32), [2.0, 2.0], false),
        "rank 2",
    );
    let ids = z(&[1, 2, 3, 4], DType::I64);
    let e = interpolate_bilinear(&ids, [2, 2], false).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    // An empty batch is a valid, empty output.
    let y = interpolate_bilinear(&z(&[0, 2, 3, 4], DType::F32), [5, 6], false).unwrap();
    assert_eq!(y.shape(), &[0, 2, 5, 6]);
}
