//! The "densenet" chain: x_1 = x_0, x_k = x_0 + x_1 + … + x_{k-1}, loss =
//! sum(x_n). Every x_k feeds every later x_j, so keeping each incoming
//! gradient alive would cost O(n²) buffers; with one buffer per value
//! (first contribution moved in, later ones added in place) the gradient
//! peak is linear in n.
use leangrad::memory::Ledger;
use leangrad::{DType, Device, Tensor};

const CPU: Device = Device::Cpu;
const M: usize = 1000; // elements per x_k
const B: usize = M * 4; // bytes per x_k (f32)

/// Builds the chain on `x0` and returns loss = sum(x_n).
fn chain_from(x0: &Tensor, n: usize) -> Tensor {
    let mut xs = vec![x0.clone(), x0.clone()];
    for k in 2..=n {
        let mut s = xs[0].add(&xs[1]).unwrap();
        for x in &xs[2..k] {
            s = s.add(x).unwrap();
        }
        xs.push(s);
    }
    xs[n].sum_all().unwrap()
}

/// A fresh leaf x_0 and the chain's loss.
fn chain(n: usize) -> (Tensor, Tensor) {
    let x0 = Tensor::randn(&[M], DType::F32, CPU, 5)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let loss = chain_from(&x0, n);
    (x0, loss)
}

/// d loss / d x_0 = 2^(n-1): x_1 = x_0 and x_k = 2 x_{k-1} for k ≥ 2.
fn expected_grad(n: usize) -> f32 {
    2f32.powi(n as i32 - 1)
}

/// Peak gradient bytes of the backward of chain(n), measured by the ledger.
fn peak_gradient_bytes(n: usize) -> usize {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let (x0, loss) = chain(n);
    ledger.reset_peak();
    loss.backward().unwrap();
    let peak = ledger.peak_gradients(CPU);
    let grad = x0.grad().unwrap().to_vec::<f32>().unwrap();
    assert!(
        grad.iter().all(|&g| g == expected_grad(n)),
        "n={n}: {}",
        grad[0]
    );
    peak
}

/// The exact peak, derived from the engine's rules. Backward of sum(x_n)
/// makes one gradient G (B bytes); x_n's chain of adds passes G itself (no
/// copy) to every x_j, j < n. Running x_{n-1}'s chain adds G into the
/// buffers of x_0 (the leaf, reached through x_0 and x_1) and x_2…x_{n-2}:
/// each already holds a shared G, so each gets one new buffer — n-2 of them,
/// with G still alive: (n-1)·B. Every later contribution is added in place,
/// and each x_k's buffer is freed once x_k's chain has run. For n = 2 the
/// leaf receives G twice through one add: G plus one new buffer, 2·B.
/// Keeping every incoming gradient instead would cost one buffer per edge,
/// about n²/2 of them.
fn expected_peak(n: usize) -> usize {
    (n - 1).max(2) * B
}

#[test]
fn peak_gradient_bytes_are_linear_in_depth() {
    for n in 2..=32 {
        assert_eq!(peak_gradient_bytes(n), expected_peak(n), "n = {n}");
    }
}

#[test]
fn collected_gradients_of_two_backwards_add_up() {
    let (x0, loss) = chain(6);
    loss.backward().unwrap();
    chain_from(&x0, 6).backward().unwrap();
    let g = x0.grad().unwrap().to_vec::<f32>().unwrap();
    assert!(g.iter().all(|&v| v == 2.0 * expected_grad(6)));
}
