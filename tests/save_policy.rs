//! The lean policy against the save-everything reference: identical
//! gradients bit for bit, and exactly the bytes each op's table states.
mod common;
use common::*;
use leangrad::{DType, Device, Tensor};

fn f32s(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_range(shape, -1.0, 1.0, DType::F32, Device::Cpu, seed).unwrap()
}

/// Looks up the (lean, save-all) saved bytes for a requires-grad mask.
fn bytes(rows: &[(u32, usize, usize)], mask: u32) -> (usize, usize) {
    let r = rows
        .iter()
        .find(|r| r.0 == mask)
        .expect("combination checked");
    (r.1, r.2)
}

#[test]
fn mul_saves_each_input_only_for_the_other_gradient() {
    let (a, b) = (f32s(&[4, 8], 1), f32s(&[8], 2));
    let rows = check_policies(&|x| x[0].mul(&x[1]), &[a, b]);
    // PyTorch's autograd keeps the same: each saved operand of `mul` is
    // guarded by whether the other input needs grad.
    assert_eq!(bytes(&rows, 0b01), (32, 32), "a needs grad: b kept");
    assert_eq!(bytes(&rows, 0b10), (128, 128), "b needs grad: a kept");
    assert_eq!(bytes(&rows, 0b11), (160, 160));
    assert_eq!(bytes(&rows, 0b00), (0, 0));
}

#[test]
fn div_keeps_the_numerator_only_for_the_denominator_gradient() {
    let a = f32s(&[3, 5], 3);
    let b = Tensor::rand_range(&[3, 5], 0.5, 2.0, DType::F32, Device::Cpu, 4).unwrap();
    let rows = check_policies(&|x| x[0].div(&x[1]), &[a, b]);
    assert_eq!(bytes(&rows, 0b01), (60, 60));
    assert_eq!(bytes(&rows, 0b10), (120, 120));
}

#[test]
fn matmul_saves_each_operand_only_for_the_other_gradient() {
    let (a, b) = (f32s(&[2, 3, 4], 5), f32s(&[4, 6], 6));
    let rows = check_policies(&|x| x[0].matmul(&x[1]), &[a, b]);
    // As PyTorch's `mm`/`bmm`: a frozen operand's partner is not kept.
    assert_eq!(bytes(&rows, 0b01), (96, 96));
    assert_eq!(bytes(&rows, 0b10), (96, 96));
    assert_eq!(bytes(&rows, 0b11), (192, 192));
}

#[test]
fn relu_like_ops_keep_one_bit_per_element() {
    for n in [1usize, 31, 32, 33, 100] {
        let x = f32s(&[n], 7 + n as u64);
        let words = n.div_ceil(32) * 4;
        let rows = check_policies(&|x| x[0].relu(), std::slice::from_ref(&x));
        assert_eq!(bytes(&rows, 1), (words, 4 * n), "relu n={n}");
        let rows = check_policies(&|x| x[0].leaky_relu(0.1), std::slice::from_ref(&x));
        assert_eq!(bytes(&rows, 1), (words, 4 * n), "leaky_relu n={n}");
        let rows = check_policies(&|x| x[0].clamp(-0.5, 0.25), std::slice::from_ref(&x));
        assert_eq!(bytes(&rows, 1), (words, 4 * n), "clamp n={n}");
    }
}

#[test]
fn max_over_a_dim_keeps_u8_window_positions_not_i64() {
    let x = f32s(&[6, 10], 9);
    let rows = check_policies(&|x| x[0].max(1, false), std::slice::from_ref(&x));
    assert_eq!(bytes(&rows, 1), (6, 6 * 8));
    let rows = check_policies(&|x| x[0].min(0, true), std::slice::from_ref(&x));
    assert_eq!(bytes(&rows, 1), (10, 10 * 8));
}

#[test]
fn an_mlp_block_is_identical_under_both_policies() {
    let (x, w, b) = (f32s(&[5, 7], 10), f32s(&[3, 7], 11), f32s(&[3], 12));
    let rows = check_policies(
        &|t| {
            t[0].matmul(&t[1].t()?)?
                .add(&t[2])?
                .relu()?
                .mul(&t[0].narrow(1, 0, 3)?)
        },
        &[x, w, b],
    );
    assert_eq!(rows.len(), 8);
    // Only x requires grad. Lean: w (84, for x's gradient) + relu's output
    // and x (60 + 140, kept by mul for its gradients). ReLU's 1-bit mask was
    // dropped when mul saved ReLU's output: 284, the same as SaveAll, which
    // keeps x, w and ReLU's output (shared with mul's, counted once).
    assert_eq!(bytes(&rows, 0b001), (284, 284));
    // Only w: lean keeps x (for w's gradient), the mask, and for relu's
    // side of mul the other factor x.narrow — a view of x, already counted.
    assert_eq!(bytes(&rows, 0b010).0, 140 + 4);
}

#[test]
fn a_relu_mask_is_dropped_when_the_next_op_keeps_the_output() {
    use leangrad::memory::{Category, Ledger};
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let x = f32s(&[64], 20).set_requires_grad(true).unwrap();
    let w = f32s(&[64], 21).set_requires_grad(true).unwrap();
    let h = x.relu().unwrap();
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::Saved),
        8,
        "two mask words"
    );
    let y = h.mul(&w).unwrap(); // keeps h (for w's gradient) and w (for h's)
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::Saved),
        256 + 256,
        "mask gone"
    );
    drop(h);
    let seed = Tensor::ones(&[64], DType::F32, Device::Cpu).unwrap();
    leangrad::autograd::backward_with(&y, Some(seed), &mut leangrad::autograd::CollectGrads)
        .unwrap();
    let expected: Vec<f32> = {
        let (xs, ws) = (x.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        xs.iter()
            .zip(&ws)
            .map(|(a, b)| if *a > 0.0 { *b } else { 0.0 })
            .collect()
    };
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), expected);
}

#[test]
fn a_relu_mask_stays_when_its_source_changed_before_being_saved() {
    use leangrad::memory::{Category, Ledger};
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let x = f32s(&[40], 22).set_requires_grad(true).unwrap();
    let y = x.relu().unwrap();
    let h = y.detach();
    h.add_scalar_(1.0).unwrap(); // allowed: relu kept no values
    let keep = leangrad::autograd::SavedTensor::new(&h, "probe");
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::Saved),
        160 + 8,
        "bits kept: h changed"
    );
    drop(keep);
    let seed = Tensor::ones(&[40], DType::F32, Device::Cpu).unwrap();
    leangrad::autograd::backward_with(&y, Some(seed), &mut leangrad::autograd::CollectGrads)
        .unwrap();
    let expected: Vec<f32> = x
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| if v > 0.0 { 1.0 } else { 0.0 })
        .collect();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), expected);
}
