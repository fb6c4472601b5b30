//! The engine's guarantees: freeing, version checks, sinks, errors.
mod common;
use common::*;
use leangrad::autograd::{attach, no_grad, BackwardOp};
use leangrad::memory::{Category, Ledger};
use leangrad::{DType, Device, Error, Result, Tensor};
use std::sync::{Arc, Mutex};

const CPU: Device = Device::Cpu;

/// An identity op whose backward writes `tag` to a log: lets tests observe
/// the order in which backward visits ops.
struct Probe {
    tag: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl BackwardOp for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }
    fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        self.log.lock().unwrap().push(self.tag.clone());
        Ok(vec![Some(g)])
    }
}

fn probe(x: &Tensor, tag: &str, log: &Arc<Mutex<Vec<String>>>) -> Tensor {
    let op = Probe {
        tag: tag.to_string(),
        log: log.clone(),
    };
    attach(x.detach(), &[x], op)
}

fn param(values: &[f32]) -> Tensor {
    Tensor::from_vec(values.to_vec(), &[values.len()], CPU)
        .unwrap()
        .into_parameter()
        .unwrap()
}

#[test]
fn saved_tensor_modified_in_place_is_an_error_at_backward() {
    let w = param(&[1.0, 2.0, 3.0]);
    let x = Tensor::from_vec(vec![4.0f32, 5.0, 6.0], &[3], CPU).unwrap();
    let y = w.mul(&x).unwrap(); // saves x for w's gradient
    x.add_(&Tensor::ones(&[3], DType::F32, CPU).unwrap())
        .unwrap();
    let seed = Tensor::ones(&[3], DType::F32, CPU).unwrap();
    let err =
        leangrad::autograd::backward_with(&y, Some(seed), &mut leangrad::autograd::CollectGrads)
            .unwrap_err();
    match err {
        Error::SavedTensorModified {
            op,
            saved_version,
            current_version,
        } => {
            assert_eq!(op, "mul");
            assert_eq!((saved_version, current_version), (0, 1));
        }
        other => panic!("expected SavedTensorModified, got {other}"),
    }
    assert!(format!("{}", Error::Backward("x".into())).contains("backward"));
}

#[test]
fn unmodified_saved_tensor_gives_the_gradient() {
    let w = param(&[1.0, 2.0, 3.0]);
    let x = Tensor::from_vec(vec![4.0f32, 5.0, 6.0], &[3], CPU).unwrap();
    let seed = Tensor::ones(&[3], DType::F32, CPU).unwrap();
    let y = w.mul(&x).unwrap();
    leangrad::autograd::backward_with(&y, Some(seed), &mut leangrad::autograd::CollectGrads)
        .unwrap();
    assert_eq!(
        w.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![4.0, 5.0, 6.0]
    );
}

#[test]
fn callback_fires_once_per_parameter_after_its_last_use() {
    // w is used three times, v twice, u once, at interleaved depths.
    let run = |log: &Arc<Mutex<Vec<String>>>| -> (Tensor, [Tensor; 3]) {
        let w = param(&[0.5, -1.0, 2.0]);
        let v = param(&[1.5, 0.25, -0.75]);
        let u = param(&[3.0, 1.0, -2.0]);
        let a = probe(&w, "w0", log).mul(&probe(&v, "v0", log)).unwrap();
        let b = a
            .add(&probe(&w, "w1", log))
            .unwrap()
            .mul(&probe(&u, "u0", log))
            .unwrap();
        let c = b
            .div(&probe(&v, "v1", log).mul(&b).unwrap().add(&b).unwrap())
            .unwrap();
        let d = c.mul(&probe(&w, "w2", log)).unwrap();
        let seed = Tensor::from_vec(vec![1.0f32, -2.0, 0.5], &[3], CPU).unwrap();
        let loss = d.mul(&seed).unwrap();
        (loss, [w, v, u])
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let (loss, params) = run(&log);
    let names = ["w", "v", "u"];
    let mut fused: Vec<(String, Vec<f32>)> = Vec::new();
    let ones = Tensor::ones(&[3], DType::F32, CPU).unwrap();
    let mut sink = leangrad::autograd::CallbackSink(|p: &Tensor, g: Tensor| {
        let i = params
            .iter()
            .position(|q| q.leaf_id() == p.leaf_id())
            .unwrap();
        log.lock().unwrap().push(format!("{}-ready", names[i]));
        fused.push((names[i].to_string(), g.to_vec::<f32>()?));
        Ok(())
    });
    leangrad::autograd::backward_with(&loss, Some(ones.clone()), &mut sink).unwrap();
    let log = log.lock().unwrap().clone();
    for name in names {
        let ready: Vec<usize> = (0..log.len())
            .filter(|&i| log[i] == format!("{name}-ready"))
            .collect();
        assert_eq!(ready.len(), 1, "{name} must be ready exactly once: {log:?}");
        let last_use = (0..log.len())
            .filter(|&i| log[i].starts_with(name) && !log[i].ends_with("ready"))
            .max()
            .unwrap();
        assert!(
            ready[0] > last_use,
            "{name} ready before its last use: {log:?}"
        );
    }
    assert_eq!(fused.len(), 3);

    // The collected path gives the same values.
    let log2 = Arc::new(Mutex::new(Vec::new()));
    let (loss2, params2) = run(&log2);
    leangrad::autograd::backward_with(&loss2, Some(ones), &mut leangrad::autograd::CollectGrads)
        .unwrap();
    for (name, values) in fused {
        let i = names.iter().position(|n| *n == name).unwrap();
        assert_eq!(
            params2[i].grad().unwrap().to_vec::<f32>().unwrap(),
            values,
            "{name}"
        );
    }
}

#[test]
fn dropping_the_output_without_backward_frees_every_saved_byte() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let w = param(&[1.0; 64]);
    let mut h = Tensor::ones(&[64], DType::F32, CPU).unwrap();
    for _ in 0..10 {
        h = h.mul(&w).unwrap().div(&w).unwrap();
    }
    assert!(ledger.live_in(CPU, Category::Saved) > 0);
    drop(h);
    assert_eq!(ledger.live_in(CPU, Category::Saved), 0);
    assert_eq!(ledger.live(CPU), 256, "only the parameter is left");
}

#[test]
fn a_very_deep_graph_drops_without_overflowing_the_stack() {
    let w = param(&[1.0]);
    let mut h = w.clone();
    for _ in 0..200_000 {
        h = h.neg().unwrap();
    }
    drop(h);
}

#[test]
fn backward_twice_through_a_freed_graph_is_an_error() {
    let w = param(&[2.0]);
    let y = w.mul(&w).unwrap();
    y.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![4.0]);
    assert!(matches!(y.backward(), Err(Error::Backward(_))));
}

#[test]
fn backward_needs_a_scalar_or_a_seed_and_a_graph() {
    let w = param(&[1.0, 2.0]);
    let y = w.mul(&w).unwrap();
    assert!(matches!(y.backward(), Err(Error::Backward(_))));
    let plain = Tensor::ones(&[1], DType::F32, CPU).unwrap();
    assert!(matches!(plain.backward(), Err(Error::Backward(_))));
    let wrong = Tensor::ones(&[3], DType::F32, CPU).unwrap();
    assert!(leangrad::autograd::backward_with(
        &y,
        Some(wrong),
        &mut leangrad::autograd::CollectGrads
    )
    .is_err());
}

#[test]
fn no_grad_records_nothing_and_saves_nothing() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let w = param(&[1.0, 2.0]);
    let y = {
        let _ng = no_grad();
        w.mul(&w).unwrap()
    };
    assert!(!y.requires_grad());
    assert_eq!(ledger.live_in(CPU, Category::Saved), 0);
    assert!(w.mul(&w).unwrap().requires_grad());
}

#[test]
fn collected_gradients_accumulate_across_backwards() {
    let w = param(&[1.0, -2.0]);
    for _ in 0..3 {
        let seed = Tensor::ones(&[2], DType::F32, CPU).unwrap();
        let y = w.mul(&w).unwrap();
        leangrad::autograd::backward_with(&y, Some(seed), &mut leangrad::autograd::CollectGrads)
            .unwrap();
    }
    assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![6.0, -12.0]);
    w.zero_grad();
    assert!(w.grad().is_none());
}

#[test]
fn saved_bytes_are_labelled_by_scope() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let w = param(&[1.0; 8]);
    let x = Tensor::ones(&[8], DType::F32, CPU).unwrap();
    let y = {
        let _s = leangrad::memory::scope("block1");
        let _t = leangrad::memory::scope("fc");
        x.mul(&w).unwrap()
    };
    assert_eq!(
        ledger.saved_by_layer(CPU),
        vec![("block1.fc/mul".to_string(), 32)]
    );
    assert_eq!(ledger.live_in(CPU, Category::Saved), 32);
    assert_eq!(ledger.live_in(CPU, Category::Parameter), 32);
    drop(y);
    assert_eq!(ledger.live_in(CPU, Category::Saved), 0);
    assert_eq!(
        ledger.live_in(CPU, Category::Activation),
        32,
        "x is back to its own category"
    );
    let report = ledger.report();
    assert_eq!(report.devices[0].peak.saved, 32);
    assert!(report.to_table().contains("block1.fc/mul"));
    assert!(report.to_json().contains("\"saved\": 32"));
}

#[test]
fn out_of_memory_is_a_typed_error_with_the_ledger() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    ledger.set_limit(CPU, Some(1000));
    let a = Tensor::zeros(&[200], DType::F32, CPU).unwrap();
    match Tensor::zeros(&[100], DType::F32, CPU) {
        Err(Error::OutOfMemory {
            requested,
            live,
            summary,
            ..
        }) => {
            assert_eq!((requested, live), (400, 800));
            assert!(summary.contains("activations"));
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    drop(a);
    assert!(Tensor::zeros(&[100], DType::F32, CPU).is_ok());
}

#[test]
fn gradcheck_catches_a_wrong_gradient() {
    struct Wrong;
    impl BackwardOp for Wrong {
        fn name(&self) -> &'static str {
            "wrong"
        }
        fn backward(self: Box<Self>, g: Tensor) -> Result<Vec<Option<Tensor>>> {
            Ok(vec![Some(g.add(&g)?)])
        }
    }
    let x = rand64(&[4], 7);
    let r = leangrad::autograd::gradcheck::gradcheck(
        |xs| Ok(attach(xs[0].detach(), &[&xs[0]], Wrong)),
        &[x],
        Default::default(),
    );
    assert!(r.is_err(), "a doubled gradient must fail gradcheck");
}
