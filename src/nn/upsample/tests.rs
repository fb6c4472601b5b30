//! The taps against hand-worked PyTorch source indices; which of PyTorch's
//! kernels a call follows; the CPU kernels against a plain per-output
//! reference built from the same taps; the meta device's plans; and, with a
//! GPU (or the simulated one), CUDA against the CPU bit for bit, forward
//! and backward, through views, in every float dtype and both formulas.

use super::cpu::{corner_sum, separable, tap, Lerp, Tap};
use super::{geometry, interpolate_bilinear, interpolate_bilinear_scale, InterpCode};
use crate::autograd::{backward_with, CollectGrads};
use crate::cuda::testing::{cpu_rand, device, vals, FLOATS};
use crate::{DType, Device, Tensor};

#[test]
fn taps_follow_pytorchs_source_index_rule() {
    // 5 → 10 without align_corners: scale 0.5, src = (o + ½)/2 − ½ ≥ 0.
    let t = |o| tap::<f32>(o, 5, 10, 0.5, false, true, false);
    assert_eq!(
        t(0),
        Tap {
            i0: 0,
            i1: 1,
            l0: 1.0,
            l1: 0.0
        }
    );
    assert_eq!(
        t(1),
        Tap {
            i0: 0,
            i1: 1,
            l0: 0.75,
            l1: 0.25
        }
    );
    // The last position's upper source is itself.
    assert_eq!(
        t(9),
        Tap {
            i0: 4,
            i1: 4,
            l0: 0.75,
            l1: 0.25
        }
    );
    // 5 → 9 with align_corners: scale (5 − 1)/(9 − 1).
    let a = tap::<f64>(3, 5, 9, 0.5, true, true, false);
    assert_eq!((a.i0, a.i1, a.l0, a.l1), (1, 2, 0.5, 0.5));
    // An axis that keeps its size copies.
    let same = tap::<f32>(4, 7, 7, 1.0, false, false, true);
    assert_eq!((same.i0, same.i1, same.l0, same.l1), (4, 4, 1.0, 0.0));
    // 1 → 7 (ASPP's pooled branch): one source, weights still split.
    let one = tap::<f32>(6, 1, 7, 1.0 / 7.0, false, true, false);
    assert_eq!((one.i0, one.i1), (0, 0));
    assert!(one.l1 > 0.0 && one.l0 + one.l1 == 1.0);
}

#[test]
fn the_kernel_is_chosen_as_pytorch_chooses() {
    let geom = |x: &Tensor, size| geometry(x, size, None, false).unwrap();
    let x = Tensor::zeros(&[2, 10, 6, 7], DType::F32, Device::Cpu).unwrap();
    // Small outputs: the channels-last kernel, 8 f32 channels per vector.
    let g = geom(&x, [9, 11]);
    assert_eq!((g.code(), g.lanes), (InterpCode::Corners, 8));
    // Large outputs of a channels-first input: the generic kernel.
    assert_eq!(geom(&x, [70, 71]).code(), InterpCode::Separable);
    // A channels-last view with C > 3: the channels-last kernel at any size.
    let cl = Tensor::zeros(&[2, 6, 7, 10], DType::BF16, Device::Cpu)
        .unwrap()
        .permute(&[0, 3, 1, 2])
        .unwrap();
    let g = geom(&cl, [70, 71]);
    assert_eq!((g.code(), g.lanes), (InterpCode::Corners, 0));
    // [N, C, 1, 1] is channels-last dense too (ASPP's pooled branch).
    let pooled = Tensor::zeros(&[2, 256, 1, 1], DType::F64, Device::Cpu).unwrap();
    let g = geom(&pooled, [65, 65]);
    assert_eq!((g.code(), g.lanes), (InterpCode::Corners, 256));
    // C = 3 does not qualify by layout.
    let rgb = Tensor::zeros(&[1, 3, 1, 1], DType::F32, Device::Cpu).unwrap();
    assert_eq!(geom(&rgb, [65, 65]).code(), InterpCode::Separable);
}

/// Output `(n, c, i, j)` from the taps, as the module doc writes it.
fn naive<T: Lerp>(x: &Tensor, size: [usize; 2], align: bool) -> Vec<f64> {
    let g = geometry(x, size, None, align).unwrap();
    let corners = g.code() == InterpCode::Corners;
    let fused = super::cpu::forward_fused::<T>(&g);
    let [n, c, h, w] = g.input_shape();
    let xs = x.contiguous().unwrap().to_f64_vec().unwrap();
    let scale = |s: f64| <T::A as super::cpu::Acc>::of_f64(s);
    let mut out = Vec::new();
    for b in 0..n {
        for ch in 0..c {
            for i in 0..size[0] {
                for j in 0..size[1] {
                    let r = tap::<T>(i, h, size[0], scale(g.scale_h), align, fused, !corners);
                    let q = tap::<T>(j, w, size[1], scale(g.scale_w), align, fused, !corners);
                    let at = |y: usize, z: usize| {
                        <T::A as super::cpu::Acc>::of_f64(xs[((b * c + ch) * h + y) * w + z])
                    };
                    let v = [
                        at(r.i0, q.i0),
                        at(r.i0, q.i1),
                        at(r.i1, q.i0),
                        at(r.i1, q.i1),
                    ];
                    let y = if corners {
                        let wts = [r.l0 * q.l0, r.l0 * q.l1, r.l1 * q.l0, r.l1 * q.l1];
                        let order = if (ch as i64) < g.lanes {
                            T::VECTOR
                        } else {
                            T::TAIL
                        };
                        corner_sum(v, wts, order)
                    } else {
                        separable(v, &r, &q)
                    };
                    out.push(num_traits::ToPrimitive::to_f64(&T::store(y).load()).unwrap());
                }
            }
        }
    }
    out
}

#[test]
fn the_cpu_kernel_is_the_per_output_formula() {
    for (size, align) in [([9, 11], false), ([70, 71], true), ([3, 2], false)] {
        let x = cpu_rand(&[2, 10, 6, 7], -2.0, 2.0, DType::F32, 3);
        let got = vals(&interpolate_bilinear(&x, size, align).unwrap());
        assert_eq!(got, naive::<f32>(&x, size, align), "{size:?}");
        let x = x.to_dtype(DType::BF16).unwrap();
        let got = vals(&interpolate_bilinear(&x, size, align).unwrap());
        assert_eq!(got, naive::<half::bf16>(&x, size, align), "bf16 {size:?}");
    }
}

#[test]
fn the_meta_device_plans_the_output_and_the_gradient() {
    let x = Tensor::zeros(&[2, 4, 5, 6], DType::F16, Device::Meta)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let y = interpolate_bilinear_scale(&x, [2.0, 1.5], false).unwrap();
    assert_eq!(
        (y.shape(), y.dtype(), y.device()),
        (&[2, 4, 10, 9][..], DType::F16, Device::Meta)
    );
    let g = Tensor::zeros(y.shape(), DType::F16, Device::Meta).unwrap();
    backward_with(&y, Some(g), &mut CollectGrads).unwrap();
    let gx = x.grad().unwrap();
    assert_eq!((gx.shape(), gx.device()), (x.shape(), Device::Meta));
}

/// The layouts the CUDA test reads inputs in: the stored tensor's shape
/// and the `[2, 5, 4, 3]` view of it.
#[derive(Clone, Copy, Debug)]
enum Layout {
    Contiguous,
    Transposed,
    ChannelsLast,
}

impl Layout {
    /// The shape of the stored tensor.
    fn stored(self) -> [usize; 4] {
        match self {
            Layout::Contiguous => [2, 5, 4, 3],
            Layout::Transposed => [2, 5, 3, 4],
            Layout::ChannelsLast => [2, 4, 3, 5],
        }
    }

    /// The `[2, 5, 4, 3]` view of a stored tensor.
    fn view(self, t: &Tensor) -> Tensor {
        match self {
            Layout::Contiguous => t.clone(),
            Layout::Transposed => t.transpose(2, 3).unwrap(),
            Layout::ChannelsLast => t.permute(&[0, 3, 1, 2]).unwrap(),
        }
    }
}

#[test]
fn cuda_gives_the_cpus_bits() {
    let Some(_dev) = device("interpolate_bilinear") else {
        return;
    };
    let cuda = Device::Cuda(0);
    // [7, 9]: the channels-last kernel; [3, 127] and [2, 130]: the generic
    // one unless the input is channels-last.
    for dtype in FLOATS {
        for layout in [Layout::Contiguous, Layout::Transposed, Layout::ChannelsLast] {
            let stored = cpu_rand(&layout.stored(), -2.0, 2.0, dtype, 7);
            for (size, align) in [([7, 9], false), ([3, 127], true), ([2, 130], false)] {
                let what = format!("{dtype:?} {layout:?} {size:?} align {align}");
                let leaf_c = stored.clone().set_requires_grad(true).unwrap();
                let yc = interpolate_bilinear(&layout.view(&leaf_c), size, align).unwrap();
                let leaf_d = stored
                    .to_device(cuda)
                    .unwrap()
                    .set_requires_grad(true)
                    .unwrap();
                let yd = interpolate_bilinear(&layout.view(&leaf_d), size, align).unwrap();
                assert_eq!(
                    vals(&yd.to_device(Device::Cpu).unwrap()),
                    vals(&yc),
                    "{what}"
                );
                // A transposed incoming gradient, read in place.
                let g = cpu_rand(&[2, 5, size[1], size[0]], -1.0, 1.0, dtype, 8);
                let gc = g.transpose(2, 3).unwrap();
                backward_with(&yc, Some(gc), &mut CollectGrads).unwrap();
                let gd = g.to_device(cuda).unwrap().transpose(2, 3).unwrap();
                backward_with(&yd, Some(gd), &mut CollectGrads).unwrap();
                assert_eq!(
                    vals(&leaf_d.grad().unwrap().to_device(Device::Cpu).unwrap()),
                    vals(&leaf_c.grad().unwrap()),
                    "{what} gradient"
                );
            }
        }
    }
}
