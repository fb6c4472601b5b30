//! A deep convolutional network (blocks of conv 3×3 → BatchNorm (eval) →
//! in-place ReLU), lean policy against save-everything: the peak of a whole
//! forward + backward, beyond the parameters.
//!
//! Frozen (only the input requires grad): per block the lean policy keeps
//! just ReLU's 1-bit mask (BatchNorm in eval reads its scale from the weight
//! and running variance, which are model state, and the conv its weight), so
//! its peak grows by exactly `n/8` bytes per block (n activations per block),
//! while save-everything keeps every conv and BatchNorm input: ~2 full
//! activations per block. Trainable: the lean peak is never above
//! save-everything's (masks hand over to the values kept anyway).
use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::memory::{Category, Ledger};
use leangrad::nn::{BatchNorm, Conv2d, Module, ReLU};
use leangrad::{DType, Device, Tensor};

const CPU: Device = Device::Cpu;
const N: usize = 2;
const C: usize = 8;
const HW: usize = 12;
const ACT: usize = N * C * HW * HW; // activations per block

struct Block {
    conv: Conv2d,
    bn: BatchNorm,
}

fn network(depth: usize, trainable: bool) -> Vec<Block> {
    (0..depth)
        .map(|i| {
            let mut conv = Conv2d::builder(C, C, 3)
                .name(&format!("conv{i}"))
                .padding(1)
                .bias(false)
                .seed(i as u64)
                .build(&CPU)
                .unwrap();
            let mut bn = BatchNorm::builder(C)
                .name(&format!("bn{i}"))
                .build2d(&CPU)
                .unwrap();
            bn.set_training(false);
            if !trainable {
                conv.weight = conv.weight.clone().set_requires_grad(false).unwrap();
                bn.weight = bn
                    .weight
                    .take()
                    .map(|w| w.set_requires_grad(false).unwrap());
                bn.bias = bn.bias.take().map(|b| b.set_requires_grad(false).unwrap());
            }
            Block { conv, bn }
        })
        .collect()
}

/// Peak bytes beyond the (constant) parameters and buffers during one
/// forward + backward of the network, under `policy`.
fn peak_of_step(depth: usize, trainable: bool, policy: SavePolicy) -> usize {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let blocks = network(depth, trainable);
    let x = Tensor::randn(&[N, C, HW, HW], DType::F32, CPU, 99)
        .unwrap()
        .set_requires_grad(!trainable)
        .unwrap();
    let resident = ledger.live(CPU);
    ledger.reset_peak();
    {
        let _p = with_save_policy(policy);
        let relu = ReLU { inplace: true };
        let mut h = x.clone();
        for b in &blocks {
            h = relu
                .apply(b.bn.forward(&b.conv.forward(&h).unwrap()).unwrap())
                .unwrap();
        }
        let loss = h.sum_all().unwrap();
        drop(h);
        loss.backward().unwrap();
    }
    assert_eq!(ledger.live_in(CPU, Category::Saved), 0);
    ledger.peak(CPU) - resident
}

#[test]
fn frozen_network_lean_peak_grows_only_by_masks_while_save_all_grows_by_activations() {
    let depths = [2usize, 4, 8, 16, 32];
    let lean: Vec<usize> = depths
        .iter()
        .map(|&d| peak_of_step(d, false, SavePolicy::Lean))
        .collect();
    let all: Vec<usize> = depths
        .iter()
        .map(|&d| peak_of_step(d, false, SavePolicy::SaveAll))
        .collect();
    println!(
        "frozen, input grad only: depth {depths:?}\n  lean peak {lean:?}\n  save-all peak {all:?}"
    );
    let per_block = ACT / 8;
    for i in 1..depths.len() {
        assert_eq!(
            lean[i] - lean[0],
            (depths[i] - depths[0]) * per_block,
            "lean, depth {}",
            depths[i]
        );
        assert!(
            all[i] - all[0] >= (depths[i] - depths[0]) * 2 * ACT * 4,
            "save-all, depth {}",
            depths[i]
        );
    }
    // The fixed part is a handful of activations, whatever the depth.
    assert!(lean[0] < 8 * ACT * 4, "{}", lean[0]);
}

#[test]
fn trainable_network_lean_peak_is_never_above_save_all() {
    for depth in [2usize, 4, 8, 16] {
        let lean = peak_of_step(depth, true, SavePolicy::Lean);
        let all = peak_of_step(depth, true, SavePolicy::SaveAll);
        println!("trainable depth {depth}: lean {lean}, save-all {all}");
        assert!(lean <= all, "depth {depth}: lean {lean} > save-all {all}");
        // Both keep each conv input and one full tensor per BatchNorm (x̂
        // vs its input); ReLU masks hand over to the next conv's saved input.
        assert_eq!(lean, all, "depth {depth}");
    }
}
