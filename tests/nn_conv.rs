//! Convolutions: forward against a naive direct loop in f64, gradcheck of
//! input, weight and bias, lean vs save-all with exact saved bytes, no
//! workspace left live, and error cases.
mod common;
use common::*;
use leangrad::memory::{Category, Ledger};
use leangrad::nn::LARGE_WORKSPACE_BYTES as LARGE;
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

/// A batch that the forward splits into several multi-item products and a
/// last single item (16 output channels over 4·3·3 column rows: two items
/// per product, five items), with a bias and with a strided bias view (read
/// by the one-item products), against the naive loop.
#[test]
fn forward_over_uneven_item_chunks_matches_a_naive_loop() {
    let c = Case {
        name: "chunks",
        op: c2(1, 1, 1, 1),
        x: &[5, 4, 3, 3],
        w: &[16, 4, 3, 3],
        bias: true,
    };
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let t = inputs(&c, dtype);
        let (expected, shape) = reference(&c, &t);
        let y = apply(c.op, &t).unwrap();
        assert_eq!(y.shape(), shape);
        assert_close(&y.to_f64_vec().unwrap(), &expected, tol);
        // The same bias values read through a stride of 2.
        let wide = Tensor::stack(&[&t[2], &t[2]], 1).unwrap();
        let strided = wide.narrow(1, 0, 1).unwrap().squeeze(1).unwrap();
        assert!(!strided.is_contiguous());
        let y = apply(c.op, &[t[0].clone(), t[1].clone(), strided]).unwrap();
        assert_close(&y.to_f64_vec().unwrap(), &expected, tol);
    }
}

/// Five items of `[32, 4, 4]`, 8 output channels of 3×3 with padding 1
/// (two items per product), and an output gradient: the item-chunk tests'
/// operands.
fn item_chunk_case(dtype: DType) -> (Conv2dOptions, Tensor, Tensor, Tensor) {
    let opts = Conv2dOptions {
        padding: [1, 1],
        ..Default::default()
    };
    let rand =
        |s: &[usize], seed| Tensor::rand_range(s, -1.0, 1.0, dtype, Device::Cpu, seed).unwrap();
    let (x, w, gy) = (
        rand(&[5, 32, 4, 4], 1),
        rand(&[8, 32, 3, 3], 2),
        rand(&[5, 8, 4, 4], 3),
    );
    (opts, x, w, gy)
}

/// The input gradient of a batch that runs several items per product
/// (8 output channels over 32·3·3 column rows: two items per product, five
/// items) equals, bit for bit, the gradients of its items taken one at a
/// time (one product per item), and still uses one item's column buffer
/// as its only workspace.
#[test]
fn input_gradient_of_item_chunks_equals_the_items_one_by_one() {
    use leangrad::autograd::{backward_with, CollectGrads};
    let (opts, x, w, gy) = item_chunk_case(DType::F32);
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let xg = x.detach().set_requires_grad(true).unwrap();
    let y = conv2d(&xg, &w, None, &opts).unwrap();
    ledger.reset_peak();
    backward_with(&y, Some(gy.clone()), &mut CollectGrads).unwrap();
    let cols = 32 * 9 * 16 * 4;
    assert_eq!(ledger.peak_in(Device::Cpu, Category::Workspace), cols);
    let batch = xg.grad().unwrap().to_f64_vec().unwrap();
    let mut one_by_one = Vec::new();
    for i in 0..5 {
        let xi = x.narrow(0, i, 1).unwrap().contiguous().unwrap();
        let xi = xi.set_requires_grad(true).unwrap();
        let yi = conv2d(&xi, &w, None, &opts).unwrap();
        let gi = gy.narrow(0, i, 1).unwrap().contiguous().unwrap();
        backward_with(&yi, Some(gi), &mut CollectGrads).unwrap();
        one_by_one.extend(xi.grad().unwrap().to_f64_vec().unwrap());
    }
    assert_eq!(batch, one_by_one);
}

/// The weight gradient of several items per product (two, two, then one
/// here) equals the sum of the items' own weight gradients, within f64
/// reassociation, and uses the one-item column buffer.
#[test]
fn weight_gradient_of_item_chunks_equals_the_sum_over_items() {
    use leangrad::autograd::{backward_with, CollectGrads};
    let (opts, x, w, gy) = item_chunk_case(DType::F64);
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let wg = w.detach().set_requires_grad(true).unwrap();
    let y = conv2d(&x, &wg, None, &opts).unwrap();
    ledger.reset_peak();
    backward_with(&y, Some(gy.clone()), &mut CollectGrads).unwrap();
    let cols = 32 * 9 * 16 * 8;
    // Held: the one-item column buffer, or the room for the CUDA kernels'
    // split partial sums where that is more (every device holds it): 40
    // ranges (80 positions, 2 each), each its own slot of 8·288 f64 sums.
    let partials = 40 * 8 * 288 * 8;
    assert_eq!(
        ledger.peak_in(Device::Cpu, Category::Workspace),
        cols.max(partials)
    );
    let batch = wg.grad().unwrap().to_f64_vec().unwrap();
    let mut sum = vec![0.0; batch.len()];
    for i in 0..5 {
        let xi = x.narrow(0, i, 1).unwrap().contiguous().unwrap();
        let wi = w.detach().set_requires_grad(true).unwrap();
        let yi = conv2d(&xi, &wi, None, &opts).unwrap();
        let gi = gy.narrow(0, i, 1).unwrap().contiguous().unwrap();
        backward_with(&yi, Some(gi), &mut CollectGrads).unwrap();
        for (s, v) in sum.iter_mut().zip(wi.grad().unwrap().to_f64_vec().unwrap()) {
            *s += v;
        }
    }
    for (a, b) in batch.iter().zip(&sum) {
        assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
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

/// The forward holds one item's column buffer as Workspace; the backward
/// that buffer, or the weight gradient's room for the CUDA kernels' split
/// partial sums where that is more (every device holds it).
#[test]
fn the_column_buffer_of_one_item_and_the_split_room_are_the_only_workspace() {
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
    // 18 positions: 9 ranges of 2, each its own slot of 4·27 f32 sums.
    let room = 9 * 4 * 27 * 4;
    assert_eq!(
        ledger.peak_in(Device::Cpu, Category::Workspace),
        cols.max(room)
    );
    assert_eq!(ledger.live_in(Device::Cpu, Category::Workspace), 0);
}

#[test]
fn modules_have_pytorch_names_shapes_and_init_bounds() {
    let dev = Device::Cpu;
    let m = Conv2d::builder(4, 6, [3, 2])
        .name("c")
        .groups(2)
        .seed(1)
        .build(&dev)
        .unwrap();
    assert_eq!(m.name(), "c");
    assert_eq!(m.options.groups, 2);
    let p = m.named_parameters();
    assert_eq!(p[0].0, "weight");
    assert_eq!(p[0].1.shape(), [6, 2, 3, 2]);
    assert_eq!(p[1].0, "bias");
    let bound = 1.0 / 12f64.sqrt();
    for (_, t) in &p {
        assert!(t.to_f64_vec().unwrap().iter().all(|v| v.abs() <= bound));
    }
    let m = Conv1d::builder(3, 5, 4)
        .name("c1")
        .bias(false)
        .seed(2)
        .build(&dev)
        .unwrap();
    assert_eq!(m.named_parameters().len(), 1);
    assert_eq!(m.weight.shape(), [5, 3, 4]);
    let m = ConvTranspose2d::builder(4, 6, 2)
        .name("t")
        .groups(2)
        .seed(3)
        .build(&dev)
        .unwrap();
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
        Conv2d::builder(3, 6, 3).groups(2).seed(1).build(&dev),
        InvalidArgument
    );
}

/// The builders set exactly the options they are given (PyTorch's defaults
/// otherwise) and draw the parameters the layers always drew: the weight
/// from `seed`, then the bias from `seed ^ 0x5eed`, uniform in ±1/√fan_in.
#[test]
fn builders_set_their_options_and_draw_the_seeded_parameters() {
    let dev = Device::Cpu;
    let drawn = |shape: &[usize], fan_in: usize, dtype: DType, seed: u64| {
        let b = 1.0 / (fan_in as f64).sqrt();
        Tensor::rand_range(shape, -b, b, dtype, dev, seed)
            .unwrap()
            .to_f64_vec()
            .unwrap()
    };
    let m = Conv2d::builder(4, 6, (3, 1))
        .stride(2)
        .padding([1, 0])
        .dilation([1, 2])
        .groups(2)
        .dtype(DType::F64)
        .seed(11)
        .build(&dev)
        .unwrap();
    let o = Conv2dOptions {
        stride: [2, 2],
        padding: [1, 0],
        dilation: [1, 2],
        groups: 2,
    };
    assert_eq!((m.options, m.name()), (o, "conv2d"));
    assert_eq!(m.weight.shape(), [6, 2, 3, 1]);
    assert_eq!(
        m.weight.to_f64_vec().unwrap(),
        drawn(&[6, 2, 3, 1], 6, DType::F64, 11)
    );
    let b = m.bias.as_ref().unwrap();
    assert_eq!(
        b.to_f64_vec().unwrap(),
        drawn(&[6], 6, DType::F64, 11 ^ 0x5eed)
    );
    let d = Conv2d::builder(2, 3, 3).build(&dev).unwrap();
    assert_eq!(d.options, Conv2dOptions::default());
    assert_eq!(d.weight.dtype(), DType::F32);
    assert_eq!(
        d.weight.to_f64_vec().unwrap(),
        drawn(&[3, 2, 3, 3], 18, DType::F32, 0)
    );
    // Every option at once, then one changed after it.
    let again = Conv2d::builder(4, 6, [3, 1])
        .options(o)
        .padding(0)
        .bias(false)
        .seed(11)
        .build(&dev)
        .unwrap();
    assert_eq!(again.options.padding, [0, 0]);
    assert_eq!(again.options.stride, [2, 2]);
    assert!(again.bias.is_none());

    let m = Conv1d::builder(6, 9, 3)
        .name("c1")
        .stride(2)
        .padding(1)
        .dilation(2)
        .groups(3)
        .seed(5)
        .build(&dev)
        .unwrap();
    let o1 = Conv1dOptions {
        stride: 2,
        padding: 1,
        dilation: 2,
        groups: 3,
    };
    assert_eq!((m.options, m.name()), (o1, "c1"));
    assert_eq!(
        m.weight.to_f64_vec().unwrap(),
        drawn(&[9, 2, 3], 6, DType::F32, 5)
    );
    let b = m.bias.as_ref().unwrap();
    assert_eq!(
        b.to_f64_vec().unwrap(),
        drawn(&[9], 6, DType::F32, 5 ^ 0x5eed)
    );
    assert_eq!(
        Conv1d::builder(1, 1, 1).build(&dev).unwrap().name(),
        "conv1d"
    );

    let m = ConvTranspose2d::builder(4, 6, [3, 2])
        .stride([2, 3])
        .padding([1, 0])
        .output_padding([1, 2])
        .dilation([1, 2])
        .groups(2)
        .seed(9)
        .build(&dev)
        .unwrap();
    let ot = ConvTranspose2dOptions {
        stride: [2, 3],
        padding: [1, 0],
        output_padding: [1, 2],
        dilation: [1, 2],
        groups: 2,
    };
    assert_eq!((m.options, m.name()), (ot, "conv_transpose2d"));
    // PyTorch's fan_in for this layout: out/groups·kh·kw.
    assert_eq!(
        m.weight.to_f64_vec().unwrap(),
        drawn(&[4, 3, 3, 2], 18, DType::F32, 9)
    );
    let b = m.bias.as_ref().unwrap();
    assert_eq!(
        b.to_f64_vec().unwrap(),
        drawn(&[6], 18, DType::F32, 9 ^ 0x5eed)
    );
    // Errors: groups that do not divide, an empty kernel.
    assert_err!(
        ConvTranspose2d::builder(4, 6, 2).groups(4).build(&dev),
        InvalidArgument
    );
    assert_err!(Conv1d::builder(2, 2, 0).build(&dev), InvalidArgument);
    assert_err!(
        Conv2d::builder(2, 2, 3).groups(0).build(&dev),
        InvalidArgument
    );
}

#[test]
fn a_module_saves_only_the_input_under_its_scope() {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let m = Conv2d::builder(2, 3, 3)
        .name("conv1")
        .seed(4)
        .build(&Device::Cpu)
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

/// The shapes the direct 3×3 kernels take on CPUs with AVX2 (f32, stride
/// 1, padding 1, output channels in blocks of 32: ResNet's and VGG's
/// 3×3 layers): planes tiled along rows and across items, a bias, and the
/// transposed convolution (the input gradient's kernel, with a bias).
/// Values and both gradients against f64 (which runs im2col) to f32
/// rounding; the column buffer of one item stays the only workspace.
#[test]
fn direct_3x3_convolutions_match_f64_and_keep_one_items_column_buffer() {
    use leangrad::autograd::{backward_with, CollectGrads};
    let same = c2(1, 1, 1, 1);
    let t = Op::ConvT(ConvTranspose2dOptions {
        padding: [1, 1],
        ..Default::default()
    });
    #[rustfmt::skip]
    let cases = [
        Case { name: "rows of 9", op: same, x: &[2, 40, 6, 9], w: &[64, 40, 3, 3], bias: true },
        Case { name: "items at 4x4", op: same, x: &[8, 32, 4, 4], w: &[32, 32, 3, 3], bias: false },
        Case { name: "items at 7x7", op: same, x: &[8, 64, 7, 7], w: &[32, 64, 3, 3], bias: true },
        Case { name: "transposed", op: t, x: &[3, 48, 5, 11], w: &[48, 64, 3, 3], bias: true },
    ];
    for c in cases {
        let t32 = inputs(&c, DType::F32);
        let (expected, _) = reference(&c, &inputs(&c, DType::F64));
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let t32: Vec<Tensor> = t32
            .into_iter()
            .map(|t| t.set_requires_grad(true).unwrap())
            .collect();
        let y = apply(c.op, &t32).unwrap();
        // Up to 576 terms of partial sums near ±10 in f32: a few 1e-6 is
        // rounding; a misplaced tap or weight is off by tenths.
        eprintln!("{}", c.name);
        assert_close(&y.to_f64_vec().unwrap(), &expected, 5e-5);
        // One item's columns: [cin·3·3, h·w] f32, cin being the
        // convolution's (the transposed one's output channels).
        let (cin, hw) = match c.op {
            Op::ConvT(_) => (c.w[1], c.x[2] * c.x[3]),
            _ => (c.x[1], c.x[2] * c.x[3]),
        };
        let cols = cin * 9 * hw * 4;
        assert_eq!(
            ledger.peak_in(Device::Cpu, Category::Workspace),
            cols,
            "{}",
            c.name
        );
        // Gradients against the same in f64, for a fixed output gradient.
        let gy = Tensor::rand_range(y.shape(), -1.0, 1.0, DType::F64, Device::Cpu, 7).unwrap();
        ledger.reset_peak();
        backward_with(
            &y,
            Some(gy.to_dtype(DType::F32).unwrap()),
            &mut CollectGrads,
        )
        .unwrap();
        assert_eq!(ledger.live_in(Device::Cpu, Category::Workspace), 0);
        let t64: Vec<Tensor> = inputs(&c, DType::F64)
            .into_iter()
            .map(|t| t.set_requires_grad(true).unwrap())
            .collect();
        let y64 = apply(c.op, &t64).unwrap();
        backward_with(&y64, Some(gy), &mut CollectGrads).unwrap();
        for (a, b) in t32.iter().zip(&t64) {
            let (a, b) = (a.grad().unwrap(), b.grad().unwrap());
            assert_close(&a.to_f64_vec().unwrap(), &b.to_f64_vec().unwrap(), 1e-4);
        }
    }
}

#[test]
fn a_frozen_layer_keeps_only_its_weight_which_costs_nothing() {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let mut m = Conv2d::builder(2, 3, 3)
        .name("frozen")
        .padding(1)
        .seed(6)
        .build(&Device::Cpu)
        .unwrap();
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

/// Configurations and naive f64 references for the convolution tests.
#[allow(dead_code)]
mod nn_conv_cases {
    use leangrad::nn::{
        conv1d, conv2d, conv_transpose2d, Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions,
    };
    use leangrad::{DType, Device, Result, Tensor};

    /// One test configuration: which op, its input/weight shapes and options.
    #[derive(Clone, Copy)]
    pub enum Op {
        Conv2d(Conv2dOptions),
        Conv1d(Conv1dOptions),
        ConvT(ConvTranspose2dOptions),
    }

    pub struct Case {
        pub name: &'static str,
        pub op: Op,
        pub x: &'static [usize],
        pub w: &'static [usize],
        pub bias: bool,
    }

    pub fn c2(stride: usize, padding: usize, dilation: usize, groups: usize) -> Op {
        Op::Conv2d(Conv2dOptions {
            stride: [stride, stride],
            padding: [padding, padding],
            dilation: [dilation, dilation],
            groups,
        })
    }

    pub fn cases() -> Vec<Case> {
        let asym = Op::Conv2d(Conv2dOptions {
            stride: [1, 2],
            padding: [1, 0],
            dilation: [2, 1],
            groups: 1,
        });
        let c1 = Op::Conv1d(Conv1dOptions {
            stride: 2,
            padding: 1,
            dilation: 2,
            groups: 2,
        });
        let t1 = Op::ConvT(ConvTranspose2dOptions {
            stride: [2, 2],
            padding: [1, 1],
            output_padding: [1, 1],
            dilation: [1, 1],
            groups: 2,
        });
        let t2 = Op::ConvT(ConvTranspose2dOptions {
            stride: [2, 1],
            padding: [1, 0],
            output_padding: [1, 1],
            dilation: [1, 2],
            groups: 1,
        });
        #[rustfmt::skip]
        let v = vec![
            Case { name: "plain", op: c2(1, 0, 1, 1), x: &[2, 3, 5, 5], w: &[4, 3, 3, 3], bias: true },
            Case { name: "stride 2 + padding", op: c2(2, 1, 1, 1), x: &[2, 3, 6, 5], w: &[4, 3, 3, 2], bias: true },
            Case { name: "dilation 2", op: c2(1, 2, 2, 1), x: &[1, 2, 5, 5], w: &[3, 2, 3, 3], bias: true },
            Case { name: "asymmetric", op: asym, x: &[1, 2, 6, 7], w: &[3, 2, 2, 3], bias: true },
            Case { name: "groups 2", op: c2(1, 1, 1, 2), x: &[2, 4, 4, 4], w: &[6, 2, 3, 3], bias: true },
            Case { name: "depthwise", op: c2(2, 1, 1, 3), x: &[2, 3, 5, 4], w: &[6, 1, 3, 3], bias: true },
            Case { name: "no bias", op: c2(1, 1, 1, 1), x: &[2, 2, 4, 3], w: &[3, 2, 2, 2], bias: false },
            Case { name: "conv1d", op: c1, x: &[2, 4, 9], w: &[6, 2, 3], bias: true },
            Case { name: "conv_transpose2d", op: t1, x: &[2, 4, 3, 3], w: &[4, 3, 3, 3], bias: true },
            Case { name: "conv_transpose2d dilated", op: t2, x: &[1, 2, 3, 2], w: &[2, 3, 2, 3], bias: false },
        ];
        v
    }

    /// Applies the case's op to `t = [x, w, (b)]`.
    pub fn apply(op: Op, t: &[Tensor]) -> Result<Tensor> {
        let b = t.get(2);
        match op {
            Op::Conv2d(o) => conv2d(&t[0], &t[1], b, &o),
            Op::Conv1d(o) => conv1d(&t[0], &t[1], b, &o),
            Op::ConvT(o) => conv_transpose2d(&t[0], &t[1], b, &o),
        }
    }

    pub fn bias_len(c: &Case) -> usize {
        match c.op {
            Op::ConvT(o) => c.w[1] * o.groups,
            _ => c.w[0],
        }
    }

    pub fn inputs(c: &Case, dtype: DType) -> Vec<Tensor> {
        let t =
            |s: &[usize], seed| Tensor::rand_range(s, -1.0, 1.0, dtype, Device::Cpu, seed).unwrap();
        let mut v = vec![t(c.x, 1), t(c.w, 2)];
        if c.bias {
            v.push(t(&[bias_len(c)], 3));
        }
        v
    }

    /// Naive direct 2-d convolution over `[n, c, h, w]` in f64.
    pub fn naive_conv(
        x: &[f64],
        xs: [usize; 4],
        w: &[f64],
        ws: [usize; 4],
        b: Option<&[f64]>,
        o: &Conv2dOptions,
    ) -> Vec<f64> {
        let ([n, c, h, wd], [oc, cig, kh, kw]) = (xs, ws);
        let oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
        let ow = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
        let cog = oc / o.groups;
        assert_eq!(cig * o.groups, c);
        let mut y = vec![0.0; n * oc * oh * ow];
        for i in 0..n {
            for co in 0..oc {
                let g = co / cog;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = b.map_or(0.0, |b| b[co]);
                        for ci in 0..cig {
                            for ki in 0..kh {
                                for kj in 0..kw {
                                    let iy = (oy * o.stride[0] + ki * o.dilation[0]) as isize
                                        - o.padding[0] as isize;
                                    let ix = (ox * o.stride[1] + kj * o.dilation[1]) as isize
                                        - o.padding[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                        continue;
                                    }
                                    let xv = x[((i * c + g * cig + ci) * h + iy as usize) * wd
                                        + ix as usize];
                                    acc += xv * w[((co * cig + ci) * kh + ki) * kw + kj];
                                }
                            }
                        }
                        y[((i * oc + co) * oh + oy) * ow + ox] = acc;
                    }
                }
            }
        }
        y
    }

    /// Naive transposed convolution: every input element scatters `x · w` into
    /// the output.
    pub fn naive_conv_t(
        x: &[f64],
        xs: [usize; 4],
        w: &[f64],
        ws: [usize; 4],
        b: Option<&[f64]>,
        o: &ConvTranspose2dOptions,
    ) -> (Vec<f64>, [usize; 4]) {
        let ([n, c, h, wd], [_, cog, kh, kw]) = (xs, ws);
        let full = |a: usize, len: usize, k: usize| {
            (len - 1) * o.stride[a] + o.dilation[a] * (k - 1) + o.output_padding[a] + 1
                - 2 * o.padding[a]
        };
        let (oh, ow, oc, cig) = (
            full(0, h, kh),
            full(1, wd, kw),
            cog * o.groups,
            c / o.groups,
        );
        let mut y = vec![0.0; n * oc * oh * ow];
        for i in 0..n {
            for co in 0..oc {
                for p in 0..oh * ow {
                    y[(i * oc + co) * oh * ow + p] = b.map_or(0.0, |b| b[co]);
                }
            }
            for ci in 0..c {
                let g = ci / cig;
                for iy in 0..h {
                    for ix in 0..wd {
                        let xv = x[((i * c + ci) * h + iy) * wd + ix];
                        for col in 0..cog {
                            for ki in 0..kh {
                                for kj in 0..kw {
                                    let oy = (iy * o.stride[0] + ki * o.dilation[0]) as isize
                                        - o.padding[0] as isize;
                                    let ox = (ix * o.stride[1] + kj * o.dilation[1]) as isize
                                        - o.padding[1] as isize;
                                    if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                        continue;
                                    }
                                    let co = g * cog + col;
                                    y[((i * oc + co) * oh + oy as usize) * ow + ox as usize] +=
                                        xv * w[((ci * cog + col) * kh + ki) * kw + kj];
                                }
                            }
                        }
                    }
                }
            }
        }
        (y, [n, oc, oh, ow])
    }

    /// The naive reference output and shape for a case.
    pub fn reference(c: &Case, t: &[Tensor]) -> (Vec<f64>, Vec<usize>) {
        let x = t[0].to_f64_vec().unwrap();
        let w = t[1].to_f64_vec().unwrap();
        let b = t.get(2).map(|b| b.to_f64_vec().unwrap());
        let b = b.as_deref();
        let s4 = |s: &[usize]| [s[0], s[1], s[2], s[3]];
        match c.op {
            Op::Conv2d(o) => {
                let y = naive_conv(&x, s4(c.x), &w, s4(c.w), b, &o);
                let probe = naive_shape(c.x, c.w, &o);
                (y, probe)
            }
            Op::Conv1d(o) => {
                let o2 = Conv2dOptions {
                    stride: [1, o.stride],
                    padding: [0, o.padding],
                    dilation: [1, o.dilation],
                    groups: o.groups,
                };
                let (xs, ws) = ([c.x[0], c.x[1], 1, c.x[2]], [c.w[0], c.w[1], 1, c.w[2]]);
                let y = naive_conv(&x, xs, &w, ws, b, &o2);
                let s = naive_shape(&xs, &ws, &o2);
                (y, vec![s[0], s[1], s[3]])
            }
            Op::ConvT(o) => {
                let (y, s) = naive_conv_t(&x, s4(c.x), &w, s4(c.w), b, &o);
                (y, s.to_vec())
            }
        }
    }

    pub fn naive_shape(x: &[usize], w: &[usize], o: &Conv2dOptions) -> Vec<usize> {
        let out = |a: usize| {
            (x[2 + a] + 2 * o.padding[a] - o.dilation[a] * (w[2 + a] - 1) - 1) / o.stride[a] + 1
        };
        vec![x[0], w[0], out(0), out(1)]
    }
}

/// The values of one convolution and its three gradients at a workspace
/// budget, with the Workspace peaks of the forward and of the backward.
fn at_budget(
    op: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Tensor,
    (x, w, b): (&Tensor, &Tensor, &Tensor),
    budget: usize,
) -> (Vec<Vec<f64>>, [usize; 2]) {
    use leangrad::autograd::{backward_with, CollectGrads};
    let _ws = leangrad::nn::with_conv_workspace(budget);
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let leaves: Vec<Tensor> = [x, w, b]
        .iter()
        .map(|t| t.detach().set_requires_grad(true).unwrap())
        .collect();
    let y = op(&leaves[0], &leaves[1], &leaves[2]);
    let forward = ledger.peak_in(Device::Cpu, Category::Workspace);
    ledger.reset_peak();
    let gy = Tensor::rand_range(y.shape(), -1.0, 1.0, DType::F64, Device::Cpu, 9).unwrap();
    backward_with(&y, Some(gy.to_dtype(y.dtype()).unwrap()), &mut CollectGrads).unwrap();
    let backward = ledger.peak_in(Device::Cpu, Category::Workspace);
    let mut vals = vec![y.to_f64_vec().unwrap()];
    vals.extend(
        leaves
            .iter()
            .map(|l| l.grad().unwrap().to_f64_vec().unwrap()),
    );
    (vals, [forward, backward])
}

/// Whether f32 products of `dtype` run on leangrad's own x86 kernels here
/// (f32 and bf16 on the AVX2 and AVX-512 paths), whose order of terms
/// depends on the depth alone, so that pieces add exactly as the whole.
fn own_kernels(dtype: DType) -> bool {
    let f32_products = matches!(dtype, DType::F32 | DType::BF16);
    f32_products && leangrad::cpu_path() != leangrad::CpuPath::Portable
}

/// A bound on the relative rounding difference between two orders of the
/// same sums (the `gemm` crate blocks a product's depth by its shape).
fn rounding(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-13,
        DType::F32 => 1e-5,
        _ => 2e-2,
    }
}

/// A column buffer shorter than one item's columns (a small workspace
/// budget) cuts each item into pieces: whole groups, else output positions
/// (forward) or column rows (gradients) of one group. Every value is the
/// whole-item products' bit for bit on leangrad's own f32 kernels (f32
/// and bf16 on AVX2 and AVX-512), and within rounding where the `gemm`
/// crate multiplies (f64, f16, the portable path), in every dtype, for groups, strides,
/// dilation, padding, 1×1 kernels, 1-d and transposed convolutions (each
/// with at least 384 output positions, so that no product covers several
/// items); the Workspace peak is the capped buffer.
#[test]
fn a_column_buffer_short_of_an_item_gives_the_same_values() {
    type Op = Box<dyn Fn(&Tensor, &Tensor, &Tensor) -> Tensor>;
    let c2d = |stride, padding, dilation, groups| -> Op {
        let o = Conv2dOptions {
            stride,
            padding,
            dilation,
            groups,
        };
        Box::new(move |x, w, b| conv2d(x, w, Some(b), &o).unwrap())
    };
    let c1d: Op = Box::new(|x, w, b| {
        let o = Conv1dOptions {
            stride: 2,
            padding: 3,
            dilation: 1,
            groups: 2,
        };
        conv1d(x, w, Some(b), &o).unwrap()
    });
    let ct: Op = Box::new(|x, w, b| {
        let o = ConvTranspose2dOptions {
            stride: [2, 1],
            padding: [1, 0],
            output_padding: [1, 0],
            groups: 3,
            ..Default::default()
        };
        conv_transpose2d(x, w, Some(b), &o).unwrap()
    });
    // (name, op, x, w, bias, the convolution's [k, l] for one group, groups)
    type Case<'a> = (
        &'a str,
        Op,
        &'a [usize],
        &'a [usize],
        usize,
        [usize; 2],
        usize,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("3x3 same", c2d([1, 1], [1, 1], [1, 1], 1), &[2, 5, 20, 21], &[6, 5, 3, 3], 6, [45, 420], 1),
        ("groups, stride 2", c2d([2, 2], [2, 1], [1, 1], 4), &[2, 8, 41, 40], &[12, 2, 5, 3], 12, [30, 420], 4),
        ("dilated", c2d([1, 1], [0, 2], [2, 3], 2), &[1, 6, 24, 30], &[4, 3, 3, 3], 4, [27, 20 * 28], 2),
        ("1x1", c2d([1, 1], [0, 0], [1, 1], 1), &[3, 7, 20, 20], &[5, 7, 1, 1], 5, [7, 400], 1),
        ("1-d", c1d, &[2, 4, 900], &[6, 2, 7], 6, [14, 450], 2),
        ("transposed", ct, &[2, 6, 14, 30], &[6, 4, 2, 3], 12, [4 * 6, 14 * 30], 3),
    ];
    for (name, op, xs, ws, bs, [k, l], groups) in &cases {
        for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
            let x = Tensor::rand_range(xs, -1.0, 1.0, dtype, Device::Cpu, 1).unwrap();
            let w = Tensor::rand_range(ws, -1.0, 1.0, dtype, Device::Cpu, 2).unwrap();
            let b = Tensor::rand_range(&[*bs], -1.0, 1.0, dtype, Device::Cpu, 3).unwrap();
            let e = dtype.size_in_bytes();
            let full = groups * k * l;
            let (want, peaks) = at_budget(op.as_ref(), (&x, &w, &b), LARGE);
            // Backward's weight gradient may hold more: the room for the
            // CUDA kernels' split partial sums, held on every device.
            assert_eq!(peaks[0], full * e, "{name} {dtype:?}");
            assert!(peaks[1] >= full * e, "{name} {dtype:?}");
            // Positions or rows of one group (the smallest pieces: three
            // at a time; four; five), one group at a time, two at a time.
            for budget in [
                1,
                4 * k.max(l) * e,
                5 * k.max(l) * e + e / 2,
                k * l * e,
                2 * k * l * e,
            ] {
                let (got, peaks) = at_budget(op.as_ref(), (&x, &w, &b), budget);
                let buffer = full.min((budget / e).max(3 * k.max(l))) * e;
                let what = format!("{name} {dtype:?} budget {budget}");
                assert_eq!(peaks[0], buffer, "{what}");
                assert!(peaks[1] >= buffer, "{what}");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let tol = match own_kernels(dtype) {
                        true => 0.0,
                        false => rounding(dtype),
                    };
                    let off = g
                        .iter()
                        .zip(w)
                        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()));
                    let worst = off.fold(0.0, f64::max);
                    assert!(worst <= tol, "{what}: value {i} off by {worst:e}");
                }
            }
        }
    }
}
