//! The "densenet" chain: x_1 = x_0, x_k = x_0 + x_1 + … + x_{k-1}, loss =
//! sum(x_n). Every x_k feeds every later x_j, so keeping each incoming
//! gradient alive would cost O(n²) buffers; with one buffer per value
//! (first contribution moved in, later ones added in place) the gradient
//! peak is linear in n.
use leangrad::memory::{Category, Ledger};
use leangrad::{DType, Device, Tensor};

const CPU: Device = Device::Cpu;
const M: usize = 1000; // elements per x_k
const B: usize = M * 4; // bytes per x_k (f32)

/// Builds the chain and returns (x_0, loss).
fn chain(n: usize) -> (Tensor, Tensor) {
    let x0 = Tensor::randn(&[M], DType::F32, CPU, 5)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let mut xs = vec![x0.clone(), x0.clone()];
    for k in 2..=n {
        let mut s = xs[0].add(&xs[1]).unwrap();
        for x in &xs[2..k] {
            s = s.add(x).unwrap();
        }
        xs.push(s);
    }
    let loss = xs[n].sum_all().unwrap();
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
    let peak = ledger.peak_in(CPU, Category::Gradient);
    let grad = x0.grad().unwrap().to_vec::<f32>().unwrap();
    assert!(
        grad.iter().all(|&g| g == expected_grad(n)),
        "n={n}: {}",
        grad[0]
    );
    peak
}

#[test]
fn peak_gradient_bytes_are_linear_in_depth() {
    for n in [2usize, 3, 4, 5, 8, 16, 32] {
        let peak = peak_gradient_bytes(n);
        println!("n={n:>2} peak gradient bytes {peak}");
    }
}
