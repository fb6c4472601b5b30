//! The deep frozen network of `tests/deep_conv_network.rs` (blocks of conv
//! 3×3 → BatchNorm (eval) → in-place ReLU, only the input requiring grad)
//! on every device: the peak of one forward + backward beyond the resident
//! parameters, input and buffers equals the CPU's at every depth, and under
//! the lean policy it grows by exactly one ReLU mask (`n/8` bytes) per
//! block — nothing else grows with depth.
mod cuda_common;
mod device_common;

use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::memory::{Category, Ledger};
use leangrad::nn::{BatchNorm, Conv2d, Module, ReLU};
use leangrad::{DType, Device, Tensor};

const N: usize = 2;
const C: usize = 8;
const HW: usize = 11; // odd, so the mask's last word is partly used
const ACT: usize = N * C * HW * HW; // activations per block
const DEPTHS: [usize; 4] = [2, 4, 8, 16];

struct Block {
    conv: Conv2d,
    bn: BatchNorm,
}

/// `t` moved to `dev`, frozen, still counted in its own category (a
/// parameter stays a parameter): onto the CPU `to_device` shares the
/// storage and so keeps it, while onto CUDA it copies into the current
/// category (`Other`) — and BatchNorm in eval mode saves a C-sized scale
/// unless its weight is model state, which would cost CUDA bytes the CPU
/// does not spend.
fn frozen(t: Tensor, dev: Device) -> Tensor {
    let moved = t.to_device(dev).unwrap();
    if let Some(category) = t.memory_category() {
        moved.set_memory_category(category);
    }
    moved.set_requires_grad(false).unwrap()
}

/// The frozen network, made on the CPU (the same values for every device)
/// and moved to `dev`; BatchNorm in eval mode with non-trivial statistics.
/// The values are drawn in `dtype` and held in `compute` (f64 for the exact
/// reference of a half-precision run).
fn network(depth: usize, (dtype, compute): (DType, DType), dev: Device) -> Vec<Block> {
    (0..depth)
        .map(|i| {
            let name = format!("conv{i}");
            let conv = Conv2d::builder(C, C, 3)
                .name(&name)
                .padding(1)
                .bias(false)
                .dtype(dtype)
                .seed(i as u64)
                .build(&Device::Cpu);
            let mut conv = conv.unwrap();
            let name = format!("bn{i}");
            let bn = BatchNorm::builder(C)
                .name(&name)
                .dtype(compute)
                .build2d(&Device::Cpu);
            let mut bn = bn.unwrap();
            bn.set_training(false);
            conv.weight = frozen(conv.weight.to_dtype(compute).unwrap(), dev);
            bn.weight = bn.weight.take().map(|w| frozen(w, dev));
            bn.bias = bn.bias.take().map(|b| frozen(b, dev));
            let seed = 500 + i as u64;
            let mean = Tensor::rand_range(&[C], -0.2, 0.2, dtype, Device::Cpu, seed).unwrap();
            let var = Tensor::rand_range(&[C], 0.5, 1.5, dtype, Device::Cpu, seed + 1).unwrap();
            // Model state, counted with the parameters as BatchNorm's own
            // buffers are (eval mode then reads its scale from them instead
            // of saving a copy).
            let state = |t: Tensor| {
                let t = t.to_dtype(compute).unwrap().to_device(dev).unwrap();
                t.set_memory_category(Category::Parameter);
                t
            };
            bn.running_mean = Some(state(mean));
            bn.running_var = Some(state(var));
            Block { conv, bn }
        })
        .collect()
}

/// Peak bytes on `dev` beyond what is resident before the step, during one
/// forward + backward under `policy`, and the input's gradient (host copy).
fn peak_of_step(depth: usize, dtype: DType, dev: Device, policy: SavePolicy) -> (usize, Tensor) {
    peak_of_step_in(depth, (dtype, dtype), dev, policy)
}

/// [`peak_of_step`] on values drawn in `dtype`, computed in `compute`.
fn peak_of_step_in(
    depth: usize,
    (dtype, compute): (DType, DType),
    dev: Device,
    policy: SavePolicy,
) -> (usize, Tensor) {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let blocks = network(depth, (dtype, compute), dev);
    let x = Tensor::randn(&[N, C, HW, HW], dtype, Device::Cpu, 99)
        .and_then(|x| x.to_dtype(compute))
        .and_then(|x| x.to_device(dev))
        .and_then(|x| x.set_requires_grad(true))
        .unwrap();
    let resident = ledger.live(dev);
    ledger.reset_peak();
    {
        let _p = with_save_policy(policy);
        let relu = ReLU { inplace: true };
        let mut h = x.clone();
        for b in &blocks {
            let y = b.conv.forward(&h).unwrap();
            h = relu.apply(b.bn.forward(&y).unwrap()).unwrap();
        }
        let loss = h.sum_all().unwrap();
        drop(h);
        loss.backward().unwrap();
    }
    assert_eq!(ledger.live_in(dev, Category::Saved), 0, "saved bytes left");
    let grad = x.grad().expect("the input's gradient");
    let peak = ledger.peak(dev) - resident;
    (peak, grad.to_device(Device::Cpu).unwrap())
}

/// ‖a − b‖ / ‖a‖ over two same-shape tensors.
fn rel_l2(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
    let diff: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
    let norm: f64 = a.iter().map(|x| x * x).sum();
    assert!(norm > 0.0, "a zero gradient");
    (diff / norm).sqrt()
}

#[test]
fn frozen_deep_network_peak_on_every_device_equals_the_cpu_and_grows_by_masks_only() {
    let mask = ACT.div_ceil(32) * 4;
    for dtype in device_common::FLOATS {
        for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
            let cpu: Vec<(usize, Tensor)> = DEPTHS
                .iter()
                .map(|&d| peak_of_step(d, dtype, Device::Cpu, policy))
                .collect();
            if policy == SavePolicy::Lean {
                for (i, &d) in DEPTHS.iter().enumerate() {
                    assert_eq!(
                        cpu[i].0 - cpu[0].0,
                        (d - DEPTHS[0]) * mask,
                        "{dtype:?} lean, depth {d}: growth beyond the masks"
                    );
                }
            } else {
                // Save-everything keeps the conv and BatchNorm inputs.
                let act = ACT * dtype.size_in_bytes();
                assert!(cpu[3].0 - cpu[0].0 >= (DEPTHS[3] - DEPTHS[0]) * 2 * act);
            }
            let exact: Vec<Tensor> = DEPTHS
                .iter()
                .map(|&d| peak_of_step_in(d, (dtype, DType::F64), Device::Cpu, policy).1)
                .collect();
            for dev in cuda_common::devices("deep frozen network") {
                for (i, &d) in DEPTHS.iter().enumerate() {
                    let (peak, grad) = peak_of_step(d, dtype, dev, policy);
                    let what = format!("{dtype:?} {policy:?} depth {d} on {dev}");
                    assert_eq!(peak, cpu[i].0, "{what}: peak beyond parameters");
                    // A deep stack compounds rounding (and a ReLU may
                    // flip on a near-zero input): the input gradient is
                    // compared by relative L2 error with the exact (f64)
                    // one, next to the CPU's own error (the devices round
                    // their half-precision sums at different points); the
                    // peak is the point.
                    let exact = &exact[i];
                    let t: f64 = if dtype == DType::F32 { 1e-4 } else { 5e-2 };
                    let (err, cpu_err) = (rel_l2(exact, &grad), rel_l2(exact, &cpu[i].1));
                    eprintln!("{what}: error {err:.3e}, the CPU's {cpu_err:.3e}");
                    assert!(
                        err <= t.max(2.0 * cpu_err),
                        "{what}: input gradient off by {err} (L2), the CPU's by {cpu_err}"
                    );
                }
            }
        }
    }
}
