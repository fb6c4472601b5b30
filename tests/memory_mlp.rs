//! The ledger on a 20-layer MLP: exact saved bytes, monotone freeing during
//! backward, and nothing left behind.
use leangrad::autograd::{attach, BackwardOp};
use leangrad::memory::{Category, Ledger};
use leangrad::nn::{Linear, Module};
use leangrad::{DType, Device, Result, Tensor};
use std::sync::{Arc, Mutex};

const CPU: Device = Device::Cpu;
const LAYERS: usize = 20;
const WIDTH: usize = 48;
const BATCH: usize = 10; // 480 activations per layer: 15 mask words

/// Identity whose backward records the ledger's live saved bytes.
struct SavedProbe {
    ledger: Ledger,
    log: Arc<Mutex<Vec<usize>>>,
}

impl BackwardOp for SavedProbe {
    fn name(&self) -> &'static str {
        "saved_probe"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        self.log
            .lock()
            .unwrap()
            .push(self.ledger.live_in(CPU, Category::Saved));
        Ok(vec![Some(g)])
    }
}

fn mlp() -> Vec<Linear> {
    (0..LAYERS)
        .map(|i| {
            Linear::builder(WIDTH, WIDTH)
                .name(&format!("fc{i}"))
                .seed(100 + i as u64)
                .build(&CPU)
                .unwrap()
        })
        .collect()
}

fn forward(
    layers: &[Linear],
    x: &Tensor,
    probe: Option<(&Ledger, &Arc<Mutex<Vec<usize>>>)>,
) -> Tensor {
    let mut h = x.clone();
    for (i, layer) in layers.iter().enumerate() {
        h = layer.forward(&h).unwrap();
        if i + 1 < layers.len() {
            let _s = leangrad::memory::scope(format!("relu{i}"));
            h = h.relu().unwrap();
        }
        if let Some((ledger, log)) = probe {
            let op = SavedProbe {
                ledger: ledger.clone(),
                log: log.clone(),
            };
            h = attach(h.detach(), &[&h], op);
        }
    }
    h.sum_all().unwrap()
}

fn param_bytes(layers: &[Linear]) -> usize {
    layers
        .iter()
        .flat_map(|l| l.parameters())
        .map(|p| p.storage_bytes())
        .sum()
}

/// What the lean policy keeps when every parameter trains: each layer's
/// input (for its weight's gradient). No weight (parameters are not
/// copied), nothing for the bias or the sum, and no ReLU mask: each ReLU's
/// 1-bit mask is dropped the moment the next layer keeps ReLU's output for
/// its own weight gradient, since the gradient can read the sign there.
fn expected_saved() -> usize {
    LAYERS * BATCH * WIDTH * 4
}

#[test]
fn saved_bytes_are_exact_and_only_fall_during_backward_and_nothing_leaks() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let layers = mlp();
    let params = param_bytes(&layers);
    assert_eq!(params, LAYERS * (WIDTH * WIDTH + WIDTH) * 4);
    assert_eq!(ledger.live(CPU), params);

    let x = Tensor::randn(&[BATCH, WIDTH], DType::F32, CPU, 1).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let loss = forward(&layers, &x, Some((&ledger, &log)));
    drop(x); // still alive as saved by fc0
    assert_eq!(ledger.live_in(CPU, Category::Saved), expected_saved());
    assert_eq!(
        ledger.saved_by_layer(CPU).len(),
        LAYERS,
        "{:?}",
        ledger.saved_by_layer(CPU)
    );

    let ready_log = Arc::new(Mutex::new(Vec::new()));
    let mut collected = 0;
    {
        let ledger = ledger.clone();
        let ready_log = ready_log.clone();
        loss.backward_with_callback(|_param, g| {
            ready_log
                .lock()
                .unwrap()
                .push(ledger.live_in(CPU, Category::Saved));
            collected += g.storage_bytes();
            // Keep the gradients, to check the bytes left at the end.
            KEEP.with(|k| k.borrow_mut().push(g));
            Ok(())
        })
        .unwrap();
    }
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), LAYERS);
    assert!(
        seen.windows(2).all(|w| w[1] <= w[0]),
        "saved bytes rose during backward: {seen:?}"
    );
    // Exactly: the probe after the last layer sees everything (each ReLU's
    // mask was dropped when the next layer kept ReLU's output). Each later
    // probe runs after a linear layer's backward released its input: that
    // ReLU output is then held by nobody else, so the ReLU rebuilds its
    // 1-bit mask (15 words) and the activation is freed at once.
    let activation = BATCH * WIDTH * 4;
    let mask = (BATCH * WIDTH).div_ceil(32) * 4;
    let mut expected = vec![LAYERS * activation];
    expected.extend((1..LAYERS).map(|j| (LAYERS - j) * activation + mask));
    assert_eq!(seen, expected);
    let ready = ready_log.lock().unwrap().clone();
    assert_eq!(ready.len(), 2 * LAYERS);
    assert!(ready.windows(2).all(|w| w[1] <= w[0]), "{ready:?}");
    assert_eq!(ledger.live_in(CPU, Category::Saved), 0);

    drop(loss);
    assert_eq!(collected, params);
    assert_eq!(
        ledger.live(CPU),
        params + collected,
        "parameters plus gradients, nothing else"
    );
    assert_eq!(ledger.live_gradients(CPU), params);
    assert_eq!(ledger.live_in(CPU, Category::ParameterGradient), params);
    KEEP.with(|k| k.borrow_mut().clear());
    assert_eq!(ledger.live(CPU), params);
}

thread_local! {
    static KEEP: std::cell::RefCell<Vec<Tensor>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[test]
fn collected_grads_path_leaves_parameters_plus_grads() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let layers = mlp();
    let params = param_bytes(&layers);
    let x = Tensor::randn(&[BATCH, WIDTH], DType::F32, CPU, 2).unwrap();
    let loss = forward(&layers, &x, None);
    drop(x);
    loss.backward().unwrap();
    drop(loss);
    let grads: usize = layers
        .iter()
        .flat_map(|l| l.parameters())
        .map(|p| p.grad().unwrap().storage_bytes())
        .sum();
    assert_eq!(grads, params);
    assert_eq!(ledger.live(CPU), params + grads);
    assert_eq!(ledger.live_in(CPU, Category::Saved), 0);
    assert_eq!(ledger.live_in(CPU, Category::Activation), 0);
}

#[test]
fn dropping_the_loss_without_backward_frees_every_saved_byte() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let layers = mlp();
    let params = param_bytes(&layers);
    let x = Tensor::randn(&[BATCH, WIDTH], DType::F32, CPU, 3).unwrap();
    let loss = forward(&layers, &x, None);
    drop(x);
    assert_eq!(ledger.live_in(CPU, Category::Saved), expected_saved());
    drop(loss);
    assert_eq!(ledger.live_in(CPU, Category::Saved), 0);
    assert_eq!(ledger.live(CPU), params);
}

#[test]
fn a_frozen_mlp_keeps_only_relu_masks_for_an_input_gradient() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let mut layers = mlp();
    for layer in &mut layers {
        layer.weight = layer.weight.clone().set_requires_grad(false).unwrap();
        layer.bias = layer
            .bias
            .take()
            .map(|b| b.set_requires_grad(false).unwrap());
    }
    let x = Tensor::randn(&[BATCH, WIDTH], DType::F32, CPU, 4)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let loss = forward(&layers, &x, None);
    // Weights are kept for the input gradient but are parameters: no extra
    // bytes. Each ReLU keeps its 1-bit mask: 15 words of 4 bytes.
    let mask = (BATCH * WIDTH).div_ceil(32) * 4;
    assert_eq!(ledger.live_in(CPU, Category::Saved), (LAYERS - 1) * mask);
    loss.backward().unwrap();
    assert_eq!(ledger.live_in(CPU, Category::Saved), 0);
    assert_eq!(x.grad().unwrap().shape(), &[BATCH, WIDTH]);
    assert!(layers.iter().all(|l| l.weight.grad().is_none()));
}
