//! `leangrad demo`: trains a small MLP on a synthetic spiral (on the CPU,
//! or on CUDA when asked: the CLI picks CUDA 0 when one is present) with
//! the fused optimizer (each parameter updated the moment its gradient
//! is final), and reports the memory ledger.

use crate::autograd::no_grad;
use crate::memory::{Ledger, MemoryReport};
use crate::nn::{Linear, Module};
use crate::ops::CrossEntropyOptions;
use crate::optim::{Optimizer, Sgd};
use crate::{rng, DType, Device, Result, Tensor};

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
    let n = 3 * points_per_class;
    let noise = rng::normal(seed, 0, 2 * n);
    let mut xs = Vec::with_capacity(2 * n);
    let mut ys = Vec::with_capacity(n);
    for class in 0..3 {
        for i in 0..points_per_class {
            let r = i as f64 / points_per_class as f64;
            let j = class * points_per_class + i;
            let theta = class as f64 * 4.0 + 4.0 * r + 0.2 * noise[2 * j];
            xs.push(r * theta.sin());
            xs.push(r * theta.cos());
            ys.push(class as i64);
        }
    }
    Ok((
        Tensor::from_f64_slice(&xs, &[n, 2], DType::F32, Device::Cpu)?,
        Tensor::from_vec(ys, &[n], Device::Cpu)?,
    ))
}

/// Runs the demo in its own ledger; `on_step(step, loss)` is called after each step.
pub fn run(opts: &DemoOptions, mut on_step: impl FnMut(usize, f64)) -> Result<DemoResult> {
    let ledger = Ledger::new();
    let _entered = ledger.enter();
    let (x, y) = spiral(opts.points_per_class, opts.seed)?;
    let (x, y) = (x.to_device(opts.device)?, y.to_device(opts.device)?);
    let layers = [
        Linear::builder(2, opts.hidden)
            .name("fc1")
            .seed(opts.seed + 1)
            .build(&opts.device)?,
        Linear::builder(opts.hidden, opts.hidden)
            .name("fc2")
            .seed(opts.seed + 2)
            .build(&opts.device)?,
        Linear::builder(opts.hidden, 3)
            .name("fc3")
            .seed(opts.seed + 3)
            .build(&opts.device)?,
    ];
    let forward = |x: &Tensor| -> Result<Tensor> {
        let h = layers[0].forward(x)?.relu()?;
        let h = layers[1].forward(&h)?.relu()?;
        layers[2].forward(&h)
    };
    let mut opt = Optimizer::new(
        layers.iter().flat_map(|l| l.parameters()),
        Sgd::new(opts.lr),
    )?;
    let mut losses = Vec::with_capacity(opts.steps);
    for step in 0..opts.steps {
        let loss = forward(&x)?.cross_entropy(&y, CrossEntropyOptions::default())?;
        let value = loss.to_scalar()?;
        // Fused SGD: each parameter is updated as soon as its gradient is
        // final, and the gradient is dropped right after.
        opt.backward_step(&loss)?;
        losses.push(value);
        on_step(step, value);
    }
    let accuracy = {
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
