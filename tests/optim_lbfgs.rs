//! L-BFGS against `torch.optim.LBFGS` (tests/fixtures/lbfgs.json, from
//! python-compare/lbfgs_fixture.py): Rosenbrock in 4 dimensions and a
//! two-parameter least-squares problem, with the fixed step and with the
//! strong-Wolfe line search, in f64: the loss each step returns, the
//! evaluation count and the parameters after every step.

use leangrad::optim::{Lbfgs, LbfgsOptions, LineSearch};
use leangrad::{Device, Error, Tensor};
use serde_json::Value;

fn fixture() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/lbfgs.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|x| match x {
            Value::Array(_) => floats(x),
            x => vec![x.as_f64().unwrap()],
        })
        .collect()
}

fn shape(v: &Value) -> Vec<usize> {
    match v {
        Value::Array(items) => {
            let mut s = vec![items.len()];
            s.extend(shape(&items[0]));
            s
        }
        _ => vec![],
    }
}

fn rosenbrock(p: &[Tensor]) -> leangrad::Result<Tensor> {
    let x = &p[0];
    let n = x.shape()[0];
    let head = x.narrow(0, 0, n - 1)?;
    let tail = x.narrow(0, 1, n - 1)?;
    let a = tail.sub(&head.square()?)?.square()?.mul_scalar(100.0)?;
    let b = head.neg()?.add_scalar(1.0)?.square()?;
    a.add(&b)?.sum_all()
}

fn least_squares(p: &[Tensor], a: &Tensor, y: &Tensor) -> leangrad::Result<Tensor> {
    let r = a.matmul(&p[0].t()?)?.add(&p[1])?.sub(y)?;
    r.mul(&r)?.sum_all()
}

fn close(got: f64, want: f64, what: &str) {
    let tol = 1e-6 * want.abs().max(1e-3);
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got}, PyTorch {want}"
    );
}

fn run_case(case: &Value) {
    let name = case["name"].as_str().unwrap();
    let params: Vec<Tensor> = case["start"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            Tensor::from_vec(floats(s), &shape(s), Device::Cpu)
                .unwrap()
                .into_parameter()
                .unwrap()
        })
        .collect();
    let o = &case["options"];
    let options = LbfgsOptions {
        lr: o["lr"].as_f64().unwrap(),
        max_iter: o["max_iter"].as_u64().unwrap() as usize,
        history_size: o["history_size"].as_u64().unwrap() as usize,
        line_search: match o["line_search_fn"].as_str() {
            Some("strong_wolfe") => LineSearch::StrongWolfe,
            _ => LineSearch::None,
        },
        ..LbfgsOptions::new(1.0)
    };
    let a = Tensor::from_vec(floats(&serde_json::json!(A)), &[5, 3], Device::Cpu).unwrap();
    let y = Tensor::from_vec(floats(&serde_json::json!(Y)), &[5, 2], Device::Cpu).unwrap();
    let mut opt = Lbfgs::new(params.clone(), options).unwrap();
    for (k, step) in case["history"].as_array().unwrap().iter().enumerate() {
        let loss = opt
            .step(|| {
                let loss = match case["loss"].as_str().unwrap() {
                    "rosenbrock" => rosenbrock(&params)?,
                    _ => least_squares(&params, &a, &y)?,
                };
                loss.backward()?;
                loss.to_scalar()
            })
            .unwrap();
        close(
            loss,
            step["loss"].as_f64().unwrap(),
            &format!("{name} step {k} loss"),
        );
        assert_eq!(
            opt.func_evals() as u64,
            step["func_evals"].as_u64().unwrap(),
            "{name} step {k} evaluations"
        );
        assert_eq!(
            opt.iterations() as u64,
            step["n_iter"].as_u64().unwrap(),
            "{name} step {k} iterations"
        );
        for (i, (p, want)) in params
            .iter()
            .zip(step["params"].as_array().unwrap())
            .enumerate()
        {
            let got = p.to_f64_vec().unwrap();
            for (j, (g, w)) in got.iter().zip(floats(want)).enumerate() {
                close(*g, w, &format!("{name} step {k} param {i}[{j}]"));
            }
            assert!(p.grad().is_none(), "the gradients are freed after a step");
        }
    }
}

const A: [[f64; 3]; 5] = [
    [0.5, -1.0, 2.0],
    [1.5, 0.25, -0.5],
    [-1.0, 0.75, 1.0],
    [0.0, 2.0, -1.5],
    [1.0, 1.0, 1.0],
];
const Y: [[f64; 2]; 5] = [
    [1.0, -2.0],
    [0.5, 3.0],
    [2.5, -0.5],
    [-1.0, 1.5],
    [0.25, 0.75],
];

#[test]
fn matches_pytorch_on_every_case() {
    let f = fixture();
    let cases = f["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for case in cases {
        run_case(case);
    }
}

#[test]
fn history_is_counted_as_optimizer_state() {
    use leangrad::memory::{Category, Ledger};
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let p = Tensor::from_vec(vec![-1.2f64, 1.0, -0.5, 0.8], &[4], Device::Cpu)
        .unwrap()
        .into_parameter()
        .unwrap();
    let mut opt = Lbfgs::new(
        [p.clone()],
        LbfgsOptions::new(1.0).max_iter(5).history_size(2),
    )
    .unwrap();
    opt.step(|| {
        let loss = rosenbrock(std::slice::from_ref(&p))?;
        loss.backward()?;
        loss.to_scalar()
    })
    .unwrap();
    // Two pairs of 4 f64 each, the last direction and the last gradient.
    assert_eq!(opt.state_bytes(), (2 * 2 + 2) * 4 * 8);
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::OptimizerState),
        opt.state_bytes()
    );
}

#[test]
fn bad_arguments_are_errors() {
    let p = Tensor::zeros(&[2], leangrad::DType::F64, Device::Cpu).unwrap();
    let not_leaf = Lbfgs::new([p.clone()], LbfgsOptions::new(1.0));
    assert!(matches!(
        not_leaf,
        Err(Error::InvalidArgument { op: "LBFGS", .. })
    ));
    let p = p.into_parameter().unwrap();
    let negative = Lbfgs::new([p.clone()], LbfgsOptions::new(-1.0));
    assert!(matches!(
        negative,
        Err(Error::InvalidArgument { op: "LBFGS", .. })
    ));
    let q = Tensor::zeros(&[2], leangrad::DType::F32, Device::Cpu)
        .unwrap()
        .into_parameter()
        .unwrap();
    let mixed = Lbfgs::new([p, q], LbfgsOptions::new(1.0));
    assert!(matches!(
        mixed,
        Err(Error::InvalidArgument { op: "LBFGS", .. })
    ));
}
