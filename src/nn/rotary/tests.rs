//! The rotary embedding against Hugging Face's composition
//! (`x·cos + rotate_half(x)·sin`, built here from tensor ops) bit for bit
//! in every float dtype, through strided views; its gradient by central
//! differences and as the inverse rotation; the meta device's plan; errors;
//! and, with a GPU (or the simulated one), CUDA against the CPU bit for
//! bit.

use super::cpu::cos_sin;
use super::{rotary_embedding, RotaryOptions};
use crate::autograd::gradcheck::{gradcheck, GradcheckOptions};
use crate::autograd::{backward_with, CollectGrads};
use crate::cuda::testing::{cpu_rand, device, vals, FLOATS};
use crate::memory::{Category, Ledger};
use crate::{DType, Device, Error, Tensor};

/// Hugging Face's `cos`, `sin` `[len, dim]` (the halves repeated) for
/// positions `start..start+len`, in `dtype` (rounded from f32).
fn tables(len: usize, dim: usize, opts: RotaryOptions, dtype: DType) -> (Tensor, Tensor) {
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for l in 0..len {
        for j in 0..dim {
            let (cv, sv) = cos_sin(
                (opts.start + l) as i64,
                j % (dim / 2),
                dim as i64,
                opts.theta,
            );
            c.push(cv);
            s.push(sv);
        }
    }
    let t = |v: Vec<f32>| {
        Tensor::from_vec(v, &[len, dim], Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    (t(c), t(s))
}

/// `x·cos + rotate_half(x)·sin` as Hugging Face's `apply_rotary_pos_emb`.
fn reference(x: &Tensor, opts: RotaryOptions) -> Tensor {
    let r = x.rank();
    let (len, dim) = (x.shape()[r - 2], x.shape()[r - 1]);
    let (cos, sin) = tables(len, dim, opts, x.dtype());
    let lo = x.narrow(-1, 0, dim / 2).unwrap();
    let hi = x.narrow(-1, dim / 2, dim / 2).unwrap();
    let rotated = Tensor::cat(&[&hi.neg().unwrap(), &lo], -1).unwrap();
    x.mul(&cos)
        .unwrap()
        .add(&rotated.mul(&sin).unwrap())
        .unwrap()
}

/// A `[2, 3, 5, 8]` view permuted from a `[2, 5, 3, 8]` tensor (a
/// projection's heads, as attention reads them).
fn heads_view(dtype: DType, seed: u64) -> Tensor {
    cpu_rand(&[2, 5, 3, 8], -2.0, 2.0, dtype, seed)
        .permute(&[0, 2, 1, 3])
        .unwrap()
}

#[test]
fn matches_hugging_faces_composition_bit_for_bit() {
    let opts = RotaryOptions::default().theta(10_000.0).start(3);
    for dtype in FLOATS {
        let x = heads_view(dtype, 1);
        let got = rotary_embedding(&x, opts).unwrap();
        assert!(got.is_contiguous());
        assert_eq!(got.shape(), x.shape());
        assert_eq!(vals(&got), vals(&reference(&x, opts)), "{dtype:?}");
        // Rank 2 and 3 take their positions along the second-to-last dim.
        let flat = cpu_rand(&[7, 6], -1.0, 1.0, dtype, 2);
        let big = RotaryOptions::default().theta(1e6);
        assert_eq!(
            vals(&rotary_embedding(&flat, big).unwrap()),
            vals(&reference(&flat, big)),
            "{dtype:?} rank 2"
        );
    }
}

#[test]
fn the_gradient_is_the_inverse_rotation_and_saves_nothing() {
    let opts = RotaryOptions::default().start(1);
    let x = heads_view(DType::F64, 3);
    gradcheck(
        |xs| rotary_embedding(&xs[0], opts),
        &[x.contiguous().unwrap()],
        GradcheckOptions::default(),
    )
    .unwrap();
    // Forward then its gradient with g = the output: R(−θ)·R(θ)·x = x, up
    // to the f32 rounding of the cos/sin tables (cos² + sin² = 1 ± 2⁻²³).
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let leaf = x.contiguous().unwrap().set_requires_grad(true).unwrap();
    let y = rotary_embedding(&leaf, opts).unwrap();
    assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 0);
    backward_with(&y, Some(y.detach()), &mut CollectGrads).unwrap();
    let back = vals(&leaf.grad().unwrap());
    for (a, b) in back.iter().zip(vals(&x)) {
        assert!((a - b).abs() < 3e-7 * b.abs().max(1.0), "{a} vs {b}");
    }
}

#[test]
fn the_meta_device_plans_the_output_only() {
    let x = Tensor::zeros(&[2, 4, 16, 8], DType::BF16, Device::Meta).unwrap();
    let y = rotary_embedding(&x, RotaryOptions::default()).unwrap();
    assert_eq!(
        (y.shape(), y.dtype(), y.device()),
        (x.shape(), DType::BF16, Device::Meta)
    );
}

#[test]
fn bad_shapes_and_bases_are_refused() {
    let odd = Tensor::zeros(&[2, 3, 5], DType::F32, Device::Cpu).unwrap();
    let flat = Tensor::zeros(&[6], DType::F32, Device::Cpu).unwrap();
    let ids = Tensor::zeros(&[2, 4], DType::I64, Device::Cpu).unwrap();
    let ok = Tensor::zeros(&[2, 4], DType::F32, Device::Cpu).unwrap();
    for (x, opts) in [
        (&odd, RotaryOptions::default()),
        (&flat, RotaryOptions::default()),
        (&ok, RotaryOptions::default().theta(0.0)),
        (&ok, RotaryOptions::default().theta(f64::NAN)),
        (&ok, RotaryOptions::default().start(1 << 24)),
    ] {
        let e = rotary_embedding(x, opts).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
    assert!(rotary_embedding(&ids, RotaryOptions::default()).is_err());
}

#[test]
fn cuda_gives_the_cpus_bits() {
    let Some(_dev) = device("rotary_embedding") else {
        return;
    };
    let cuda = Device::Cuda(0);
    let opts = RotaryOptions::default().theta(500_000.0).start(11);
    for dtype in FLOATS {
        let x = heads_view(dtype, 4);
        let want = rotary_embedding(&x, opts).unwrap();
        let on = x.contiguous().unwrap().to_device(cuda).unwrap();
        // The same permuted view on the device.
        let on = on.permute(&[0, 1, 2, 3]).unwrap();
        let got = rotary_embedding(&on, opts).unwrap();
        assert_eq!(
            vals(&got.to_device(Device::Cpu).unwrap()),
            vals(&want),
            "{dtype:?}"
        );
        // Strided in place on the device, and backward's inverse rotation.
        let base = cpu_rand(&[2, 5, 3, 8], -2.0, 2.0, dtype, 5);
        let leaf_c = base.clone().set_requires_grad(true).unwrap();
        let yc = rotary_embedding(&leaf_c.permute(&[0, 2, 1, 3]).unwrap(), opts).unwrap();
        let g = cpu_rand(yc.shape(), -1.0, 1.0, dtype, 6);
        backward_with(&yc, Some(g.clone()), &mut CollectGrads).unwrap();
        let leaf_d = base
            .to_device(cuda)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let yd = rotary_embedding(&leaf_d.permute(&[0, 2, 1, 3]).unwrap(), opts).unwrap();
        assert_eq!(
            vals(&yd.to_device(Device::Cpu).unwrap()),
            vals(&yc),
            "{dtype:?} view"
        );
        let gd = g.to_device(cuda).unwrap();
        backward_with(&yd, Some(gd), &mut CollectGrads).unwrap();
        assert_eq!(
            vals(&leaf_d.grad().unwrap().to_device(Device::Cpu).unwrap()),
            vals(&leaf_c.grad().unwrap()),
            "{dtype:?} gradient"
        );
    }
}
