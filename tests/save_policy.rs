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
    assert_eq!(bytes(&rows, 0b01), (32, 128 + 32), "a needs grad: b kept");
    assert_eq!(bytes(&rows, 0b10), (128, 128 + 32), "b needs grad: a kept");
    assert_eq!(bytes(&rows, 0b11), (160, 160));
    assert_eq!(bytes(&rows, 0b00), (0, 0));
}

#[test]
fn div_keeps_the_numerator_only_for_the_denominator_gradient() {
    let a = f32s(&[3, 5], 3);
    let b = Tensor::rand_range(&[3, 5], 0.5, 2.0, DType::F32, Device::Cpu, 4).unwrap();
    let rows = check_policies(&|x| x[0].div(&x[1]), &[a, b]);
    assert_eq!(bytes(&rows, 0b01), (60, 120));
    assert_eq!(bytes(&rows, 0b10), (120, 120));
}

#[test]
fn matmul_saves_each_operand_only_for_the_other_gradient() {
    let (a, b) = (f32s(&[2, 3, 4], 5), f32s(&[4, 6], 6));
    let rows = check_policies(&|x| x[0].matmul(&x[1]), &[a, b]);
    assert_eq!(bytes(&rows, 0b01), (96, 96 + 96));
    assert_eq!(bytes(&rows, 0b10), (96, 96 + 96));
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
    // Only x requires grad. Lean: w (84, for x's gradient) + relu's mask (4)
    // + relu's output and x (60 + 140, for mul's gradients) = 288. SaveAll
    // keeps x, w and relu's output, which mul saves too (shared, counted
    // once) = 284: here the mask costs 4 bytes more than it saves, because
    // the next op keeps relu's output anyway.
    assert_eq!(bytes(&rows, 0b001), (288, 284));
    // Only w: lean keeps x (for w's gradient), the mask, and for relu's
    // side of mul the other factor x.narrow — a view of x, already counted.
    assert_eq!(bytes(&rows, 0b010).0, 140 + 4);
}
