//! Buffer reuse: an op writes its output over an input nothing else holds
//! (a norm, relu or residual add over the previous layer's output, a
//! gradient over the incoming one). It must never change a result, and it
//! must never write over values someone can still see. These tests compare
//! every tiny model in every case with reuse on and off bit for bit, and
//! try to make reuse overwrite something shared.

mod cast_runs;
mod tiny_models;

use cast_runs::{cast_run, values, Mode, MODES, SAME_SIZE_PAIRS};
use leangrad::autograd::{with_buffer_reuse, with_save_policy, SavePolicy};
use leangrad::memory::{Category, Ledger};
use leangrad::models::{Case, FeatureMaps, ResNet, ResNetConfig};
use leangrad::nn::{BatchNorm, Module, ReLU};
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Optimizer, Sgd};
use leangrad::{DType, Device, Result, Tensor};

/// Everything one step computes (loss, logits, every parameter after a
/// fused SGD step, every input gradient) as bit patterns, and the step's
/// peak bytes and number of allocations.
fn step(name: &str, case: &Case, reuse: bool) -> Result<(Vec<Vec<u64>>, [u64; 2])> {
    let (_, build, input) = tiny_models::models()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .expect("a tiny model");
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let _r = with_buffer_reuse(reuse);
    let mut model = build(DType::F32, Device::Cpu)?;
    case.apply(model.as_mut())?;
    let params = model.parameters();
    let trained: Vec<Tensor> = params
        .iter()
        .filter(|p| p.requires_grad())
        .cloned()
        .collect();
    let x = input.make(2, case.input_requires_grad(), DType::F32, Device::Cpu)?;
    let targets = input.targets(2, 5, Device::Cpu)?;
    ledger.reset_peak(); // the step's own peak, not the model's building
    let before = ledger.allocation_count(Device::Cpu);
    let logits = model.step_logits(&x)?;
    let loss = logits.cross_entropy(&targets, CrossEntropyOptions::default())?;
    let mut bits = vec![bits_of(&loss)?, bits_of(&logits)?];
    if trained.is_empty() {
        if loss.requires_grad() {
            loss.backward()?;
        }
    } else {
        Optimizer::new(trained, Sgd::new(0.01).momentum(0.9))?.backward_step(&loss)?;
    }
    for p in &params {
        bits.push(bits_of(p)?);
    }
    if let Some(g) = x.grad() {
        bits.push(bits_of(&g)?);
    }
    let allocations = ledger.allocation_count(Device::Cpu) - before;
    Ok((bits, [ledger.peak(Device::Cpu) as u64, allocations]))
}

fn bits_of(t: &Tensor) -> Result<Vec<u64>> {
    Ok(t.to_f64_vec()?.iter().map(|v| v.to_bits()).collect())
}

#[test]
fn every_model_and_case_gives_bit_identical_results_with_reuse_on_and_off() {
    for (name, _, _) in tiny_models::models() {
        for case in Case::all() {
            let (on, [peak_on, made_on]) = step(name, &case, true).expect("step with reuse");
            let (off, [peak_off, made_off]) = step(name, &case, false).expect("step without reuse");
            assert_eq!(on.len(), off.len(), "{name} {case}");
            for (i, (a, b)) in on.iter().zip(&off).enumerate() {
                assert!(a == b, "{name} {case}: result {i} differs with reuse on");
            }
            assert!(
                peak_on <= peak_off,
                "{name} {case}: reuse raised the peak {peak_off} -> {peak_on}"
            );
            assert!(made_on <= made_off, "{name} {case}: reuse allocated more");
            // Every model reuses something in every case: a norm writes over
            // its input, a residual add over a projection, a relu's or
            // norm's input gradient over the incoming one. Except VGG-16
            // without norms where nothing trains (its relus are in place
            // either way, as PyTorch's `inplace=True`, and no backward runs).
            let frozen_plain_vgg = name == "vgg16_tiny" && case.to_string().starts_with("norm");
            if !frozen_plain_vgg {
                assert!(made_on < made_off, "{name} {case}: nothing was reused");
            }
        }
    }
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, Device::Cpu, seed).expect("randn")
}

fn bn(c: usize) -> BatchNorm {
    BatchNorm::builder(c).build2d(&Device::Cpu).expect("bn")
}

#[test]
fn an_owned_input_that_another_op_saved_is_not_written_over() -> Result<()> {
    let w = randn(&[1, 3, 1, 1], 2).set_requires_grad(true)?;
    let x = randn(&[2, 3, 4, 4], 1);
    let before = x.to_vec::<f32>()?;
    // mul saves x for w's gradient; then x is handed to the norm and relu.
    let kept = x.mul(&w)?;
    let y = ReLU { inplace: false }.forward_owned(bn(3).forward_owned(x.clone())?)?;
    drop(x);
    kept.sum_all()?.add(&y.sum_all()?)?.backward()?;
    // w's gradient is Σ x over everything but the channel: x is intact.
    let g = w.grad().expect("grad").to_vec::<f32>()?;
    for (c, gc) in g.iter().enumerate() {
        let s: f32 = (0..2)
            .flat_map(|n| (0..16).map(move |i| n * 48 + c * 16 + i))
            .map(|i| before[i])
            .sum();
        assert!((gc - s).abs() <= 1e-5 * s.abs().max(1.0), "channel {c}");
    }
    Ok(())
}

#[test]
fn a_view_or_clone_keeps_the_input_from_being_written_over() -> Result<()> {
    let x = randn(&[2, 3, 4, 4], 3);
    let before = x.to_vec::<f32>()?;
    let view = x.reshape(&[6, 16])?;
    let y = bn(3).forward_owned(x)?;
    assert_eq!(
        view.to_vec::<f32>()?,
        before,
        "a view saw its values change"
    );
    assert!(!y.shares_storage_with(&view));

    let x = randn(&[2, 3, 4, 4], 4);
    let copy = x.clone();
    let y = ReLU { inplace: true }.forward_owned(x)?;
    assert!(!y.shares_storage_with(&copy));
    assert_eq!(
        copy.to_vec::<f32>()?,
        randn(&[2, 3, 4, 4], 4).to_vec::<f32>()?
    );
    Ok(())
}

#[test]
fn an_exclusive_input_is_written_over_and_a_leaf_requiring_grad_never() -> Result<()> {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let x = randn(&[2, 3, 8, 8], 5);
    let bytes = x.storage_bytes();
    let norm = bn(3);
    let live = ledger.live(Device::Cpu);
    // Without a gradient nothing is saved (with one, x̂ would be).
    let plain = leangrad::autograd::no_grad();
    let y = norm.forward_owned(x)?;
    drop(plain);
    assert_eq!(
        ledger.live(Device::Cpu),
        live,
        "the norm allocated {bytes} bytes anew"
    );
    drop(y);

    let leaf = randn(&[2, 3, 8, 8], 6).set_requires_grad(true)?;
    let values = leaf.to_vec::<f32>()?;
    let y = bn(3).forward_owned(leaf.clone())?;
    assert!(!y.shares_storage_with(&leaf));
    y.sum_all()?.backward()?;
    assert_eq!(leaf.to_vec::<f32>()?, values);
    assert!(leaf.grad().is_some());
    Ok(())
}

#[test]
fn a_relu_mask_does_not_switch_to_values_written_over_later() -> Result<()> {
    // relu keeps a 1-bit mask and listens to its output's storage: if a
    // later op saves those values, it reads them instead. A residual add
    // written over the relu's output changes them, so the mask must stay.
    let run = |reuse: bool| -> Result<Vec<f32>> {
        let _r = with_buffer_reuse(reuse);
        let x = randn(&[64], 7).set_requires_grad(true)?;
        let r = randn(&[64], 8);
        let h = x.mul_scalar(1.0)?.relu()?;
        let z = h.add_owned(&r)?; // over relu's output when reuse is on
        let sq = z.square()?; // saves z (the same storage)
        sq.sum_all()?.backward()?;
        x.grad().expect("grad").to_vec::<f32>()
    };
    assert_eq!(run(true)?, run(false)?);
    Ok(())
}

#[test]
fn modifying_a_saved_tensor_in_place_is_still_caught() -> Result<()> {
    let w = randn(&[8], 9).set_requires_grad(true)?;
    let x = randn(&[8], 10);
    let y = x.mul(&w)?;
    let _plain = leangrad::autograd::no_grad();
    x.add_scalar_(1.0)?;
    drop(_plain);
    let err = y
        .sum_all()?
        .backward()
        .expect_err("x was modified after being saved");
    assert!(
        matches!(err, leangrad::Error::SavedTensorModified { .. }),
        "{err}"
    );
    Ok(())
}

#[test]
fn feature_maps_keep_their_values_though_later_layers_reuse_buffers() -> Result<()> {
    let config = ResNetConfig {
        base_width: 4,
        num_classes: 5,
        ..ResNetConfig::resnet18(5)
    };
    let model = ResNet::new(config, DType::F32, Device::Cpu, 3)?;
    let x = randn(&[2, 3, 32, 32], 11);
    let maps = model.features(&x, &["conv1", "bn1", "layer1.0", "layer1"])?;
    let _r = with_buffer_reuse(false);
    let fresh = model.features(&x, &["conv1", "bn1", "layer1.0", "layer1"])?;
    for ((name, a), (_, b)) in maps.iter().zip(&fresh) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?, "{name}");
    }
    assert_ne!(maps[0].1.to_vec::<f32>()?, maps[1].1.to_vec::<f32>()?);
    Ok(())
}

#[test]
fn the_pytorch_policy_does_not_reuse_unless_asked() {
    let _p = with_save_policy(SavePolicy::SaveAll);
    assert!(!leangrad::autograd::buffer_reuse());
    let _r = with_buffer_reuse(true);
    assert!(leangrad::autograd::buffer_reuse());
}

/// ResNet-18, batch 64, 224², f32, SGD with momentum, one whole step,
/// predicted on the meta device (which allocates exactly what the CPU
/// does): the peaks buffer reuse brings, and what they were without it.
#[test]
fn resnet18_peaks_at_batch_64_with_and_without_reuse() {
    use leangrad::memory_plan::{plan, OptimizerKind, StepInput, StepSpec};
    const MIB: f64 = 1024.0 * 1024.0;
    let peak = |case: &str, reuse: bool| {
        let _r = with_buffer_reuse(reuse);
        let spec = StepSpec {
            batch: 64,
            input: StepInput::Image {
                channels: 3,
                size: 224,
            },
            classes: 1000,
            dtype: DType::F32,
            optimizer: OptimizerKind::Sgd,
            fused: false,
            checkpoint: false,
            optimizer_state: leangrad::optim::StateFormat::Full,
            autocast: None,
            case: case.parse::<Case>().expect("case"),
            device: Device::Meta,
        };
        let p = plan("resnet18", &spec).expect("plan");
        p.lean.report.peak_total as f64 / MIB
    };
    let limits = [
        ("input-bn-eval", 362.0),
        ("surgical-last", 380.0),
        // "1.11 GiB" as the report prints it (two decimals)
        ("all", 1.115 * 1024.0),
        ("input", 742.0),
        ("norm", 742.0),
        ("conv", 1.115 * 1024.0),
        ("linear", 380.0),
    ];
    for (case, limit) in limits {
        let (on, off) = (peak(case, true), peak(case, false));
        assert!(on <= limit, "{case}: {on:.2} MiB > {limit} MiB");
        assert!(
            on <= off,
            "{case}: {on:.2} MiB with reuse, {off:.2} without"
        );
    }
    // Without reuse the stem's norm output was a second 196 MiB buffer.
    assert!(peak("input-bn-eval", false) > 479.0);
    assert!(peak("surgical-last", false) > 473.0);
}

#[test]
fn dropout_written_over_its_input_gives_the_same_values_and_gradient() -> Result<()> {
    use leangrad::nn::{dropout, dropout_owned};
    let run = |owned: bool| -> Result<(Vec<f32>, Vec<f32>, usize)> {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let a = randn(&[4, 300], 12).set_requires_grad(true)?;
        let h = a.mul_scalar(3.0)?;
        let before = ledger.allocation_count(Device::Cpu);
        let y = if owned {
            dropout_owned(h, 0.3, 5, 7)?
        } else {
            dropout(&h, 0.3, 5, 7)?
        };
        let made = (ledger.allocation_count(Device::Cpu) - before) as usize;
        y.square()?.sum_all()?.backward()?;
        Ok((y.to_vec()?, a.grad().expect("grad").to_vec()?, made))
    };
    let (y_owned, g_owned, made_owned) = run(true)?;
    let (y, g, made) = run(false)?;
    assert_eq!(y_owned, y);
    assert_eq!(g_owned, g);
    assert_eq!((made_owned, made), (0, 1), "the owned dropout allocated");
    Ok(())
}

/// The activations handed over: tanh and sigmoid keep their output, so
/// they write over an exclusive input even while a gradient flows; GELU
/// and SiLU keep their input, so they do only where no gradient flows (a
/// frozen prefix). Values, gradients and saved bytes equal the borrowed
/// ops'; only the allocations differ.
#[test]
fn activations_write_over_an_owned_input_only_when_backward_cannot_need_it() -> Result<()> {
    type Act = fn(Tensor) -> Result<Tensor>;
    let owned: [(&str, Act, bool); 4] = [
        ("tanh", |x| x.tanh_owned(), true),
        ("sigmoid", |x| x.sigmoid_owned(), true),
        ("gelu", |x| x.gelu_owned(false), false),
        ("silu", |x| x.silu_owned(), false),
    ];
    let borrowed = |name: &str, x: &Tensor| -> Result<Tensor> {
        match name {
            "tanh" => x.tanh(),
            "sigmoid" => x.sigmoid(),
            "gelu" => x.gelu(false),
            _ => x.silu(),
        }
    };
    // (values, input gradient, allocations by the activation, saved bytes)
    type Run = (Vec<f32>, Option<Vec<f32>>, u64, usize);
    let run = |name: &str, f: Option<Act>, grad: bool| -> Result<Run> {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let a = randn(&[4, 300], 21).set_requires_grad(grad)?;
        let h = a.mul_scalar(1.5)?;
        let before = ledger.allocation_count(Device::Cpu);
        let saved_before = ledger.live_in(Device::Cpu, Category::Saved);
        let y = match f {
            Some(f) => f(h)?,
            None => borrowed(name, &h)?,
        };
        let made = ledger.allocation_count(Device::Cpu) - before;
        let saved = ledger.live_in(Device::Cpu, Category::Saved) - saved_before;
        let values = y.to_vec()?;
        if grad {
            y.square()?.sum_all()?.backward()?;
        }
        Ok((
            values,
            a.grad().map(|g| g.to_vec()).transpose()?,
            made,
            saved,
        ))
    };
    for (name, f, keeps_output) in owned {
        for grad in [false, true] {
            let (v, g, made, saved) = run(name, Some(f), grad)?;
            let (v0, g0, made0, saved0) = run(name, None, grad)?;
            assert_eq!(v, v0, "{name} values, grad {grad}");
            assert_eq!(g, g0, "{name} gradient");
            assert_eq!(saved, saved0, "{name} saved bytes");
            assert_eq!(made0, 1, "{name}: the borrowed op makes its output");
            let in_place = keeps_output || !grad;
            assert_eq!(made, u64::from(!in_place), "{name}, grad {grad}");
        }
    }
    // A clone still held keeps its values: the op goes out of place.
    let h = randn(&[10], 3);
    let held = h.clone();
    let before = held.to_vec::<f32>()?;
    let y = h.tanh_owned()?;
    assert_eq!(held.to_vec::<f32>()?, before);
    assert_eq!(y.to_vec::<f32>()?, held.tanh()?.to_vec::<f32>()?);
    Ok(())
}

/// GELU handed an input that a gradient flows through (on the CPU) writes
/// gelu'(x) over it and saves that, so backward is one product: the values
/// and the input gradient are bit for bit the borrowed op's (which saves x
/// and evaluates gelu' in backward), for the exact and tanh forms, in every
/// float dtype, over inputs spanning the tails, ±0, ±∞ and NaN and long
/// enough to run in parallel chunks. The op allocates only its output, and
/// the saved bytes and the meta device's ledger are the borrowed op's.
#[test]
fn gelu_saving_its_derivative_equals_the_borrowed_op_bit_for_bit() -> Result<()> {
    const N: usize = 40_000;
    let mut xs: Vec<f64> = (0..N)
        .map(|i| (i as f64 - N as f64 / 2.0) / 1600.0)
        .collect();
    let specials = [
        0.0, -0.0, 1e-30, -1e-30, -40.0, 40.0, 1e30, -1e30, 7.25, -7.25,
    ];
    xs[..specials.len()].copy_from_slice(&specials);
    xs.extend([f64::INFINITY, f64::NEG_INFINITY, f64::NAN]);
    let gs: Vec<f64> = (0..xs.len())
        .map(|i| ((i * 37) % 101) as f64 / 50.0 - 1.0)
        .collect();
    // (values, input gradient as bits; allocations by the op, saved bytes, peak)
    type Run = (Option<[Vec<u64>; 2]>, [u64; 3]);
    let run = |dtype: DType, device: Device, approximate: bool, owned: bool| -> Result<Run> {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let make = |v: &[f64]| -> Result<Tensor> {
            Tensor::from_vec(v.to_vec(), &[v.len()], Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(device)
        };
        let a = make(&xs)?.set_requires_grad(true)?;
        let g = make(&gs)?;
        let h = a.mul_scalar(1.0)?;
        let before = ledger.allocation_count(device);
        let saved_before = ledger.live_in(device, Category::Saved);
        ledger.reset_peak();
        let y = if owned {
            h.gelu_owned(approximate)?
        } else {
            h.gelu(approximate)?
        };
        let made = ledger.allocation_count(device) - before;
        let saved = (ledger.live_in(device, Category::Saved) - saved_before) as u64;
        let peak = ledger.peak(device) as u64;
        y.mul(&g)?.sum_all()?.backward()?;
        let bits = match device.is_meta() {
            true => None,
            false => Some([bits_of(&y)?, bits_of(&a.grad().expect("a gradient"))?]),
        };
        Ok((bits, [made, saved, peak]))
    };
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for approximate in [false, true] {
            let case = format!("{dtype:?}, approximate {approximate}");
            let (borrowed, [made0, saved0, peak0]) = run(dtype, Device::Cpu, approximate, false)?;
            let (owned, [made, saved, peak]) = run(dtype, Device::Cpu, approximate, true)?;
            assert!(owned == borrowed, "{case}: values or gradient differ");
            assert_eq!(
                (made, saved, peak),
                (made0, saved0, peak0),
                "{case}: ledger"
            );
            assert_eq!(made, 1, "{case}: the op allocates its output only");
            let (_, meta) = run(dtype, Device::Meta, approximate, true)?;
            assert_eq!(meta, [made, saved, peak], "{case}: meta ledger");
        }
    }
    Ok(())
}

/// A cast between dtypes of one element size, handed its input, converts
/// the elements where they are: the values and gradient of `to_dtype`, the
/// same node, no allocation; a held clone or reuse off makes it `to_dtype`.
/// The meta device's ledger moves exactly as the CPU's.
#[test]
fn same_size_casts_convert_an_owned_input_in_place() -> Result<()> {
    // Past the parallel threshold, so the chunked conversion runs too.
    const SPREAD: usize = 40_000;
    let modes = MODES;
    for (from, to) in SAME_SIZE_PAIRS {
        let v = values(from, SPREAD);
        let grads: &[bool] = if from.is_float() {
            &[false, true]
        } else {
            &[false]
        };
        for &grad in grads {
            let at = |device, mode| cast_run(from, to, &v, device, grad, mode);
            let reference = at(Device::Cpu, Mode::Borrowed)?;
            assert!(reference.values.is_some());
            assert_eq!(reference.grad.is_some(), grad && to.is_float());
            for mode in modes {
                let cpu = at(Device::Cpu, mode)?;
                let meta = at(Device::Meta, mode)?;
                let case = format!("{from:?} → {to:?}, grad {grad}, {mode:?}");
                assert!(cpu.values == reference.values, "{case}: values");
                assert!(cpu.grad == reference.grad, "{case}: gradient");
                assert_eq!(cpu.requires_grad, reference.requires_grad, "{case}");
                assert_eq!(cpu.ledger[2], reference.ledger[2], "{case}: saved bytes");
                let in_place = mode == Mode::Owned;
                assert_eq!(cpu.ledger[0], u64::from(!in_place), "{case}: allocations");
                assert_eq!(cpu.same_storage, in_place, "{case}: storage");
                assert_eq!(meta.ledger, cpu.ledger, "{case}: meta ledger");
                assert_eq!(meta.same_storage, in_place, "{case}: meta storage");
            }
        }
    }
    Ok(())
}

/// The cast goes out of place whenever backward reads its input: `mul`
/// keeps `h` for `w`'s gradient and `exp` keeps its output, so those
/// storages are held twice. The gradients equal the borrowed cast's.
#[test]
fn a_cast_never_writes_over_values_a_backward_reads() -> Result<()> {
    let leaf = |seed| -> Result<Tensor> {
        randn(&[64], seed)
            .to_dtype(DType::F16)?
            .set_requires_grad(true)
    };
    let to_f32_sum = |t: &Tensor| t.sum_all()?.to_dtype(DType::F32);
    type Grads = (Vec<u64>, Vec<u64>, u64);
    let run = |owned: bool, exp: bool| -> Result<Grads> {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let (a, w) = (leaf(31)?, leaf(32)?);
        let h = a.mul_scalar(2.0)?;
        // Either h saved by mul for w's gradient, or exp's saved output.
        let (kept, h) = if exp {
            let e = h.exp()?;
            (h.mul(&w)?, e)
        } else {
            (h.mul(&w)?, h)
        };
        let before = ledger.allocation_count(Device::Cpu);
        let y = if owned {
            h.to_dtype_owned(DType::BF16)?
        } else {
            h.to_dtype(DType::BF16)?
        };
        let made = ledger.allocation_count(Device::Cpu) - before;
        to_f32_sum(&kept)?
            .add(&to_f32_sum(&y.square()?)?)?
            .backward()?;
        let bits = |t: &Tensor| cast_runs::bits_of(&t.grad().expect("grad"));
        Ok((bits(&a)?, bits(&w)?, made))
    };
    for exp in [false, true] {
        let (ga, gw, made) = run(true, exp)?;
        let (ga0, gw0, made0) = run(false, exp)?;
        assert_eq!(
            (made, made0),
            (1, 1),
            "exp {exp}: the saved storage was cast in place"
        );
        assert!(ga == ga0 && gw == gw0, "exp {exp}: gradients differ");
    }
    // w's gradient is h itself, 2a: h kept its f16 values.
    let (_, gw, _) = run(true, false)?;
    let a = leaf(31)?.mul_scalar(2.0)?;
    assert_eq!(gw, cast_runs::bits_of(&a)?);
    Ok(())
}

/// relu keeps a 1-bit mask and listens to its output's storage, to read the
/// values instead once another op saves them. A cast in place changes those
/// values' dtype and moves the version, so the mask must stay.
#[test]
fn a_relu_mask_does_not_switch_to_values_cast_in_place() -> Result<()> {
    let run = |reuse: bool, owned: bool| -> Result<Vec<u64>> {
        let _r = with_buffer_reuse(reuse);
        let x = randn(&[64], 30)
            .to_dtype(DType::F16)?
            .set_requires_grad(true)?;
        let h = x.mul_scalar(1.0)?.relu()?;
        let y = if owned {
            h.to_dtype_owned(DType::BF16)?
        } else {
            h.to_dtype(DType::BF16)?
        };
        let sq = y.square()?; // saves y: the relu output's storage when in place
        sq.sum_all()?.backward()?;
        cast_runs::bits_of(&x.grad().expect("grad"))
    };
    let reference = run(false, false)?;
    assert_eq!(run(true, true)?, reference);
    assert_eq!(run(false, true)?, reference);
    Ok(())
}

/// Leaves freed NaN buffers of `sizes` f32 elements in the host cache
/// (each at least its `CACHED_MIN_BYTES` minimum), so the next requests of those sizes
/// get them back with their old values.
fn poison_host_cache(sizes: &[usize]) -> Result<()> {
    leangrad::memory::release_cached_host_buffers();
    let mut held = Vec::new();
    for &n in sizes {
        assert!(n * 4 >= leangrad::memory::CACHED_MIN_BYTES, "{n} elements");
        held.push(Tensor::full(&[n], f64::NAN, DType::F32, Device::Cpu)?);
    }
    drop(held);
    assert!(leangrad::memory::cached_host_bytes() >= sizes.iter().sum::<usize>() * 4);
    Ok(())
}

/// `f`'s values computed once over an empty host cache and once over
/// cached NaN buffers of `sizes` elements: buffers an op takes without a
/// zero fill (outputs and scratch it overwrites) must show no old value.
fn same_over_stale_buffers(
    what: &str,
    sizes: &[usize],
    f: impl Fn() -> Result<Vec<Tensor>>,
) -> Result<()> {
    leangrad::memory::release_cached_host_buffers();
    let clean: Vec<Vec<f32>> = f()?
        .iter()
        .map(|t| t.to_vec::<f32>())
        .collect::<Result<_>>()?;
    poison_host_cache(sizes)?;
    let reused: Vec<Vec<f32>> = f()?
        .iter()
        .map(|t| t.to_vec::<f32>())
        .collect::<Result<_>>()?;
    leangrad::memory::release_cached_host_buffers();
    for (i, (c, r)) in clean.iter().zip(&reused).enumerate() {
        assert!(
            c.iter().all(|v| v.is_finite()),
            "{what}: output {i} of the clean run"
        );
        let (cb, rb): (Vec<u32>, Vec<u32>) = (
            c.iter().map(|v| v.to_bits()).collect(),
            r.iter().map(|v| v.to_bits()).collect(),
        );
        assert!(cb == rb, "{what}: output {i} differs over reused buffers");
    }
    Ok(())
}

fn grad_of(t: &Tensor) -> Tensor {
    t.grad().expect("a gradient")
}

#[test]
fn outputs_over_reused_host_buffers_hold_no_old_values() -> Result<()> {
    use leangrad::nn::{conv2d, scaled_dot_product_attention, Conv2dOptions, SdpaOptions};
    let cpu = Device::Cpu;
    // matmul: a [512, 512] product is exactly 1 MiB.
    let a = Tensor::randn(&[512, 512], DType::F32, cpu, 1)?;
    let b = Tensor::randn(&[512, 512], DType::F32, cpu, 2)?;
    same_over_stale_buffers("matmul", &[512 * 512], || Ok(vec![a.matmul(&b)?]))?;

    // A 3×3 convolution, forward and both gradients, with and without a
    // bias: output [4, 64, 32, 32] (1 MiB) and one item's column buffer
    // [576, 1024] (2.25 MiB).
    let opts = Conv2dOptions {
        padding: [1, 1],
        ..Default::default()
    };
    let x = Tensor::randn(&[4, 64, 32, 32], DType::F32, cpu, 3)?.set_requires_grad(true)?;
    let w = Tensor::randn(&[64, 64, 3, 3], DType::F32, cpu, 4)?
        .mul_scalar(0.05)?
        .set_requires_grad(true)?;
    let bias = Tensor::randn(&[64], DType::F32, cpu, 5)?;
    for with_bias in [false, true] {
        same_over_stale_buffers("conv2d", &[4 * 64 * 1024, 576 * 1024], || {
            let y = conv2d(&x, &w, with_bias.then_some(&bias), &opts)?;
            y.square()?.sum_all()?.backward()?;
            let out = vec![y, grad_of(&x), grad_of(&w)];
            x.zero_grad();
            w.zero_grad();
            Ok(out)
        })?;
    }

    // Attention probabilities [1, 4, 256, 256] (1 MiB) with fully masked
    // rows, which must come out 0 rather than as the old values.
    let q = Tensor::randn(&[1, 4, 256, 32], DType::F32, cpu, 6)?.set_requires_grad(true)?;
    let k = Tensor::randn(&[1, 4, 256, 32], DType::F32, cpu, 7)?;
    let v = Tensor::randn(&[1, 4, 256, 32], DType::F32, cpu, 8)?;
    let keep: Vec<f64> = (0..256 * 256)
        .map(|i| f64::from(i / 256 % 3 != 0))
        .collect();
    let mask = Tensor::from_f64_slice(&keep, &[256, 256], DType::U8, cpu)?;
    let sdpa = SdpaOptions::default().mask(mask);
    same_over_stale_buffers("attention", &[4 * 256 * 256, 4 * 256 * 256], || {
        let o = scaled_dot_product_attention(&q, &k, &v, &sdpa)?;
        o.square()?.sum_all()?.backward()?;
        let out = vec![o, grad_of(&q)];
        q.zero_grad();
        Ok(out)
    })
}
