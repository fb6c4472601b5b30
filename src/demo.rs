//! `leangrad demo`: trains a small MLP on a synthetic spiral (on the CPU,
//! or on CUDA when asked: the CLI picks CUDA 0 when one is present) with
//! the fused optimizer (each parameter updated the moment its gradient
//! is final), and reports the memory ledger.

use crate::autograd::no_grad;
use crate::memory::{Ledger, MemoryReport, Phase};
use crate::nn::{Linear, Module};
use crate::ops::CrossEntropyOptions;
use crate::optim::{Optimizer, Sgd};
use crate::{rng, DType, Device, Error, Result, Tensor};
use std::ops::ControlFlow;

/// What the demo trains.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Optimisation steps (full batch).
    pub steps: usize,
    /// Width of the two hidden layers.
    pub hidden: usize,
    /// Points per class (3 classes).
    pub points_per_class: usize,
    /// SGD learning rate.
    pub lr: f64,
    /// Seed for data and weights.
    pub seed: u64,
    /// Where to train (the data is made on the host and copied there).
    pub device: Device,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            steps: 300,
            hidden: 64,
            points_per_class: 100,
            lr: 0.5,
            seed: 7,
            device: Device::Cpu,
        }
    }
}

/// What the demo measured.
#[derive(Debug)]
pub struct DemoResult {
    /// Loss after each step.
    pub losses: Vec<f64>,
    /// Training accuracy at the end.
    pub accuracy: f64,
    /// The ledger after the last step.
    pub memory: MemoryReport,
}

/// Three interleaved spiral arms in 2-d, labels 0..3.
pub fn spiral(points_per_class: usize, seed: u64) -> Result<(Tensor, Tensor)> {
    let per = points_per_class;
    let n = crate::tensor::checked_numel("spiral", &[3, per])?;
    // Point j = class·per + i, radius i/per, angle with noise j of the seed.
    let polar = |j: usize| {
        let (class, i) = (j / per, j % per);
        let r = i as f64 / per as f64;
        let noise = rng::normal_at(seed, 2 * j as u64);
        (r, class as f64 * 4.0 + 4.0 * r + 0.2 * noise)
    };
    let xs = Tensor::from_f64_fn(&[n, 2], DType::F32, Device::Cpu, |k| {
        let (r, theta) = polar(k / 2);
        r * if k % 2 == 0 { theta.sin() } else { theta.cos() }
    })?;
    let ys = Tensor::from_f64_fn(&[n], DType::I64, Device::Cpu, |j| (j / per) as f64)?;
    Ok((xs, ys))
}

impl DemoOptions {
    /// Checks the sizes and the learning rate: a width, point count or
    /// step count of 0 (or a learning rate that is not a positive number)
    /// is an [`Error::InvalidArgument`] naming the option.
    pub fn check(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidArgument { op: "demo", msg });
        for (name, value) in [
            ("--hidden", self.hidden),
            ("--points", self.points_per_class),
            ("--steps", self.steps),
        ] {
            if value == 0 {
                return bad(format!("{name} must be at least 1, not 0"));
            }
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr must be a positive number, not {}", self.lr));
        }
        Ok(())
    }
}

/// The three layers of the demo's MLP on `device`.
fn layers(opts: &DemoOptions, device: Device) -> Result<[Linear; 3]> {
    let layer = |i: u64, inp: usize, out: usize| {
        Linear::builder(inp, out)
            .name(&format!("fc{i}"))
            .seed(opts.seed + i)
            .build(&device)
    };
    Ok([
        layer(1, 2, opts.hidden)?,
        layer(2, opts.hidden, opts.hidden)?,
        layer(3, opts.hidden, 3)?,
    ])
}

/// Forward through the MLP: `fc3(relu(fc2(relu(fc1(x)))))`.
fn mlp_forward(layers: &[Linear; 3], x: &Tensor) -> Result<Tensor> {
    let h = layers[0].forward(x)?.relu()?;
    let h = layers[1].forward(&h)?.relu()?;
    layers[2].forward(&h)
}

/// The peak bytes of the demo's training on its device, predicted on the
/// meta device (no data, milliseconds): parameters, data and one fused
/// step, which every later step repeats.
pub fn predict_peak(opts: &DemoOptions) -> Result<usize> {
    opts.check()?;
    let ledger = Ledger::new();
    let _entered = ledger.enter();
    let n = crate::tensor::checked_numel("demo", &[3, opts.points_per_class])?;
    let x = Tensor::zeros(&[n, 2], DType::F32, Device::Meta)?;
    let y = Tensor::zeros(&[n], DType::I64, Device::Meta)?;
    let layers = layers(opts, Device::Meta)?;
    let mut opt = Optimizer::new(
        layers.iter().flat_map(|l| l.parameters()),
        Sgd::new(opts.lr),
    )?;
    let loss = mlp_forward(&layers, &x)?.cross_entropy(&y, CrossEntropyOptions::default())?;
    opt.backward_step(&loss)?;
    Ok(ledger.peak(Device::Meta))
}

/// Runs the demo in its own ledger; `on_step(step, loss)` is called after
/// each step and may stop the training early (`ControlFlow::Break`: the
/// result then covers the steps run).
pub fn run(
    opts: &DemoOptions,
    mut on_step: impl FnMut(usize, f64) -> ControlFlow<()>,
) -> Result<DemoResult> {
    opts.check()?;
    let ledger = Ledger::new();
    let _entered = ledger.enter();
    let (x, y) = spiral(opts.points_per_class, opts.seed)?;
    let (x, y) = (x.to_device(opts.device)?, y.to_device(opts.device)?);
    let layers = layers(opts, opts.device)?;
    let forward = |x: &Tensor| mlp_forward(&layers, x);
    let mut opt = Optimizer::new(
        layers.iter().flat_map(|l| l.parameters()),
        Sgd::new(opts.lr),
    )?;
    let mut losses = Vec::new();
    // Each step marks its phases on the ledger, so that the report names
    // the phase its peak was reached in (building the layers and copying
    // the data is setup).
    for step in 0..opts.steps {
        ledger.set_phase(Phase::Forward);
        let loss = forward(&x)?.cross_entropy(&y, CrossEntropyOptions::default())?;
        let value = loss.to_scalar()?;
        // Fused SGD: each parameter is updated as soon as its gradient is
        // final, and the gradient is dropped right after.
        ledger.set_phase(Phase::Backward);
        opt.backward_step(&loss)?;
        losses.push(value);
        if on_step(step, value).is_break() {
            break;
        }
    }
    let accuracy = {
        ledger.set_phase(Phase::Forward);
        let _ng = no_grad();
        let predicted = forward(&x)?.argmax(-1, false)?.to_vec::<i64>()?;
        let labels = y.to_vec::<i64>()?;
        let right = predicted
            .iter()
            .zip(&labels)
            .filter(|(p, l)| p == l)
            .count();
        right as f64 / labels.len() as f64
    };
    Ok(DemoResult {
        losses,
        accuracy,
        memory: ledger.report(),
    })
}
