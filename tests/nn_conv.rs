//! Convolutions: forward against a naive direct loop in f64, gradcheck of
//! input, weight and bias, lean vs save-all with exact saved bytes, no
//! workspace left live, and error cases.
mod common;
mod nn_conv_cases;
use common::*;
use leangrad::memory::{Category, Ledger};
use leangrad::nn::{
    conv1d, conv2d, conv_transpose2d, Conv1d, Conv1dOptions, Conv2d, Conv2dOptions,
    ConvTranspose2d, ConvTranspose2dOptions, Module,
};
use leangrad::{DType, Device, Tensor};
use nn_conv_cases::*;

#[test]
fn forward_matches_a_naive_loop() {
    for c in cases() {
        for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
            let t = inputs(&c, dtype);
            let y = apply(c.op, &t).unwrap();
            assert_eq!(y.dtype(), dtype);
            let (expected, shape) = reference(&c, &t);
            assert_eq!(y.shape(), shape, "{}", c.name);
            let tol = match dtype {
                DType::F64 => 1e-12,
                DType::F32 => 1e-5,
                DType::F16 => 1e-2,
                _ => 6e-2,
            };
            assert_close(&y.to_f64_vec().unwrap(), &expected, tol);
        }
    }
}

#[test]
fn non_contiguous_operands_give_the_same_result() {
    let c = &cases()[1];
    let t = inputs(c, DType::F64);
    // A transposed-then-transposed-back copy: same values, strided layout.
    let xt = t[0]
        .transpose(2, 3)
        .unwrap()
        .contiguous()
        .unwrap()
        .transpose(2, 3)
        .unwrap();
    assert!(!xt.is_contiguous());
    let a = apply(c.op, &t).unwrap().to_f64_vec().unwrap();
    let b = apply(c.op, &[xt, t[1].clone(), t[2].clone()])
        .unwrap()
        .to_f64_vec()
        .unwrap();
    assert_eq!(a, b);
}

#[test]
fn gradients_pass_gradcheck() {
    for c in cases() {
        let t = inputs(&c, DType::F64);
        let op = c.op;
        check(|t| apply(op, t), &t);
    }
}

/// Saved bytes for a requires-grad mask (bit 0 input, 1 weight, 2 bias):
/// lean keeps the input iff the weight needs grad and the weight iff the
/// input does; save-all keeps both whenever a node is recorded.
fn expected_bytes(mask: u32, x: usize, w: usize) -> (usize, usize) {
    let lean = if mask & 2 != 0 { x } else { 0 } + if mask & 1 != 0 { w } else { 0 };
    let all = if mask != 0 { x + w } else { 0 };
    (lean, all)
}

#[test]
fn lean_and_save_all_agree_and_save_exactly_the_formula() {
    for c in cases() {
        let t = inputs(&c, DType::F32);
        let (xb, wb) = (4 * t[0].numel(), 4 * t[1].numel());
        let op = c.op;
        let rows = check_policies(&|t| apply(op, t), &t);
        assert_eq!(rows.len(), if c.bias { 8 } else { 4 });
        for (mask, lean, all) in rows {
            assert_eq!(
                (lean, all),
                expected_bytes(mask, xb, wb),
                "{} mask {mask:03b}",
                c.name
            );
        }
    }
}

#[test]
fn no_workspace_stays_live() {
    for c in cases() {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let t: Vec<Tensor> = inputs(&c, DType::F32)
            .into_iter()
            .map(|t| t.set_requires_grad(true).unwrap())
            .collect();
        let y = apply(c.op, &t).unwrap();
        assert_eq!(
            ledger.live_in(Device::Cpu, Category::Workspace),
            0,
            "{}",
            c.name
        );
        assert!(
            ledger.peak_in(Device::Cpu, Category::Workspace) > 0,
            "{}: columns are workspace",
            c.name
        );
        let seed = Tensor::ones(y.shape(), DType::F32, Device::Cpu).unwrap();
        leangrad::autograd::backward_with(&y, Some(seed), &mut leangrad::autograd::CollectGrads)
            .unwrap();
        assert_eq!(
            ledger.live_in(Device::Cpu, Category::Workspace),
            0,
            "{}",
            c.name
        );
        assert_eq!(
            ledger.live_in(Device::Cpu, Category::Saved),
            0,
            "{}",
            c.name
        );
        assert!(t.iter().all(|t| t.grad().is_some()));
    }
}

#[test]
fn the_column_buffer_of_one_item_is_the_only_workspace() {
    let c = &cases()[0];
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let t: Vec<Tensor> = inputs(c, DType::F32)
        .into_iter()
        .map(|t| t.set_requires_grad(true).unwrap())
        .collect();
    // One item's columns: [groups, cin/groups·kh·kw, oh·ow] f32.
    let cols = 4 * (3 * 3 * 3) * (3 * 3);
    let y = apply(c.op, &t).unwrap();
    assert_eq!(ledger.peak_in(Device::Cpu, Category::Workspace), cols);
    ledger.reset_peak();
    let seed = Tensor::ones(y.shape(), DType::F32, Device::Cpu).unwrap();
    leangrad::autograd::backward_with(&y, Some(seed), &mut leangrad::autograd::CollectGrads)
        .unwrap();
    assert_eq!(ledger.peak_in(Device::Cpu, Category::Workspace), cols);
    assert_eq!(ledger.live_in(Device::Cpu, Category::Workspace), 0);
}

#[test]
fn modules_have_pytorch_names_shapes_and_init_bounds() {
    let dev = Device::Cpu;
    let o = Conv2dOptions {
        groups: 2,
        ..Default::default()
    };
    let m = Conv2d::new("c", 4, 6, [3, 2], o, true, DType::F32, dev, 1).unwrap();
    let p = m.named_parameters();
    assert_eq!(p[0].0, "weight");
    assert_eq!(p[0].1.shape(), [6, 2, 3, 2]);
    assert_eq!(p[1].0, "bias");
    let bound = 1.0 / 12f64.sqrt();
    for (_, t) in &p {
        assert!(t.to_f64_vec().unwrap().iter().all(|v| v.abs() <= bound));
    }
    let m = Conv1d::new(
        "c1",
        3,
        5,
        4,
        Conv1dOptions::default(),
        false,
        DType::F32,
        dev,
        2,
    )
    .unwrap();
    assert_eq!(m.named_parameters().len(), 1);
    assert_eq!(m.weight.shape(), [5, 3, 4]);
    let ot = ConvTranspose2dOptions {
        groups: 2,
        ..Default::default()
    };
    let m = ConvTranspose2d::new("t", 4, 6, [2, 2], ot, true, DType::F32, dev, 3).unwrap();
    assert_eq!(m.weight.shape(), [4, 3, 2, 2]);
    assert_eq!(m.bias.as_ref().unwrap().shape(), [6]);
    let bound = 1.0 / 12f64.sqrt();
    assert!(m
        .weight
        .to_f64_vec()
        .unwrap()
        .iter()
        .all(|v| v.abs() <= bound));
    let y = m
        .forward(&Tensor::zeros(&[1, 4, 3, 3], DType::F32, dev).unwrap())
        .unwrap();
    assert_eq!(y.shape(), [1, 6, 4, 4]);
    assert_err!(
        Conv2d::new("c", 3, 6, [3, 3], o, true, DType::F32, dev, 1),
        InvalidArgument
    );
}

#[test]
fn a_module_saves_only_the_input_under_its_scope() {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let m = Conv2d::new(
        "conv1",
        2,
        3,
        [3, 3],
        Conv2dOptions::default(),
        true,
        DType::F32,
        Device::Cpu,
        4,
    )
    .unwrap();
    let x = Tensor::rand(&[1, 2, 5, 5], DType::F32, Device::Cpu, 5).unwrap();
    let y = m.forward(&x).unwrap();
    // The weight needs grad, so the input is kept; the input does not, so
    // the weight (a parameter, which costs nothing extra) is not.
    assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 50 * 4);
    assert_eq!(
        ledger.saved_by_layer(Device::Cpu),
        vec![("conv1/conv2d".to_string(), 200)]
    );
    drop(y);
    assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 0);
}

#[test]
fn bad_shapes_are_typed_errors() {
    let f = |s: &[usize]| Tensor::zeros(s, DType::F32, Device::Cpu).unwrap();
    let d = Conv2dOptions::default();
    // Channel mismatch.
    assert_err!(
        conv2d(&f(&[1, 3, 5, 5]), &f(&[4, 2, 3, 3]), None, &d),
        ShapeMismatch
    );
    assert_err!(
        conv1d(
            &f(&[1, 3, 5]),
            &f(&[4, 2, 3]),
            None,
            &Conv1dOptions::default()
        ),
        ShapeMismatch
    );
    let dt = ConvTranspose2dOptions::default();
    assert_err!(
        conv_transpose2d(&f(&[1, 3, 5, 5]), &f(&[4, 2, 3, 3]), None, &dt),
        ShapeMismatch
    );
    // Groups not dividing the channels.
    let g = Conv2dOptions { groups: 2, ..d };
    assert_err!(
        conv2d(&f(&[1, 3, 5, 5]), &f(&[4, 1, 3, 3]), None, &g),
        InvalidArgument
    );
    assert_err!(
        conv2d(&f(&[1, 4, 5, 5]), &f(&[3, 2, 3, 3]), None, &g),
        InvalidArgument
    );
    let gt = ConvTranspose2dOptions { groups: 2, ..dt };
    assert_err!(
        conv_transpose2d(&f(&[1, 3, 5, 5]), &f(&[3, 2, 3, 3]), None, &gt),
        InvalidArgument
    );
    assert_err!(
        conv2d(
            &f(&[1, 4, 5, 5]),
            &f(&[4, 4, 3, 3]),
            None,
            &Conv2dOptions { groups: 0, ..d }
        ),
        InvalidArgument
    );
    // Kernel larger than the padded input.
    assert_err!(
        conv2d(&f(&[1, 1, 2, 5]), &f(&[1, 1, 3, 3]), None, &d),
        InvalidArgument
    );
    let p = Conv2dOptions {
        padding: [1, 0],
        ..d
    };
    assert!(conv2d(&f(&[1, 1, 2, 5]), &f(&[1, 1, 3, 3]), None, &p).is_ok());
    let dil = Conv2dOptions {
        dilation: [1, 3],
        ..d
    };
    assert_err!(
        conv2d(&f(&[1, 1, 5, 5]), &f(&[1, 1, 3, 3]), None, &dil),
        InvalidArgument
    );
    assert_err!(
        conv1d(
            &f(&[1, 1, 2]),
            &f(&[1, 1, 3]),
            None,
            &Conv1dOptions::default()
        ),
        InvalidArgument
    );
    // Bias of the wrong length, wrong ranks, zero stride, mixed dtypes.
    assert_err!(
        conv2d(&f(&[1, 1, 5, 5]), &f(&[2, 1, 3, 3]), Some(&f(&[3])), &d),
        ShapeMismatch
    );
    assert_err!(
        conv2d(&f(&[1, 5, 5]), &f(&[2, 1, 3, 3]), None, &d),
        InvalidArgument
    );
    assert_err!(
        conv2d(
            &f(&[1, 1, 5, 5]),
            &f(&[2, 1, 3, 3]),
            None,
            &Conv2dOptions {
                stride: [0, 1],
                ..d
            }
        ),
        InvalidArgument
    );
    let w64 = Tensor::zeros(&[2, 1, 3, 3], DType::F64, Device::Cpu).unwrap();
    assert_err!(conv2d(&f(&[1, 1, 5, 5]), &w64, None, &d), DTypeMismatch);
    // Output padding must stay below the stride or the dilation.
    let op = ConvTranspose2dOptions {
        output_padding: [1, 0],
        ..dt
    };
    assert_err!(
        conv_transpose2d(&f(&[1, 2, 3, 3]), &f(&[2, 2, 3, 3]), None, &op),
        InvalidArgument
    );
    // A transposed convolution whose padding eats the whole output.
    let pt = ConvTranspose2dOptions {
        padding: [2, 2],
        ..dt
    };
    assert_err!(
        conv_transpose2d(&f(&[1, 2, 1, 1]), &f(&[2, 2, 3, 3]), None, &pt),
        InvalidArgument
    );
}

#[test]
fn large_inputs_take_the_parallel_kernels_and_agree() {
    let pad = c2(1, 1, 1, 1);
    let t = Op::ConvT(ConvTranspose2dOptions {
        padding: [1, 1],
        ..Default::default()
    });
    // Columns of 16·9 × 24·24 and a transposed output item of 64·24·24
    // elements: both above the parallel threshold.
    #[rustfmt::skip]
    let big = [
        Case { name: "big conv", op: pad, x: &[1, 16, 24, 24], w: &[8, 16, 3, 3], bias: true },
        Case { name: "big conv_t", op: t, x: &[1, 8, 24, 24], w: &[8, 64, 3, 3], bias: true },
    ];
    for c in big {
        let t = inputs(&c, DType::F64);
        let (expected, shape) = reference(&c, &t);
        let y = apply(c.op, &t).unwrap();
        assert_eq!(y.shape(), shape, "{}", c.name);
        assert_close(&y.to_f64_vec().unwrap(), &expected, 1e-12);
    }
}

#[test]
fn a_frozen_layer_keeps_only_its_weight_which_costs_nothing() {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let o = Conv2dOptions {
        padding: [1, 1],
        ..Default::default()
    };
    let mut m = Conv2d::new("frozen", 2, 3, [3, 3], o, true, DType::F32, Device::Cpu, 6).unwrap();
    m.weight = m.weight.clone().set_requires_grad(false).unwrap();
    m.bias = m.bias.take().map(|b| b.set_requires_grad(false).unwrap());
    assert_eq!(m.parameters().len(), 2);
    let x = Tensor::rand(&[2, 2, 4, 4], DType::F32, Device::Cpu, 7)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let y = m.forward(&x).unwrap();
    // Only the input needs grad: the weight is kept, but it is a parameter.
    assert_eq!(ledger.live_in(Device::Cpu, Category::Saved), 0);
    let seed = Tensor::ones(y.shape(), DType::F32, Device::Cpu).unwrap();
    leangrad::autograd::backward_with(&y, Some(seed), &mut leangrad::autograd::CollectGrads)
        .unwrap();
    assert_eq!(x.grad().unwrap().shape(), [2, 2, 4, 4]);
    assert!(m.weight.grad().is_none());
}
