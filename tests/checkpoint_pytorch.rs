//! PyTorch's checkpoints resume in leangrad: a Linear-ReLU-Linear model
//! trained 3 steps with torch.optim.Adam / AdamW, its `state_dict()`s
//! written as a leangrad checkpoint (`python-compare/checkpoint_fixture.py`),
//! is loaded into a leangrad model and optimizer built differently, and 2
//! more steps match PyTorch's own continuation (parameters and moments).
//!
//! With `LEANGRAD_CHECKPOINT_EXPORT=DIR`, the continued state is also saved
//! as `DIR/<kind>`, which `checkpoint_fixture.py --verify DIR/<kind> <kind>`
//! loads back into PyTorch.
use leangrad::io::{load_safetensors, state_dict_of, Checkpoint};
use leangrad::nn::{Linear, Module};
use leangrad::ops::Reduction;
use leangrad::optim::{Adam, Optimizer};
use leangrad::{Device, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoints")
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Largest `|a − b| / max(1, |b|)`.
fn worst(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    values(a)
        .iter()
        .zip(values(b))
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

fn resume(kind: &str, hyper: Adam) {
    // Another initialisation and another rate: the checkpoint's must win.
    let l0 = Linear::builder(4, 8).seed(77).build(&Device::Cpu).unwrap();
    let l2 = Linear::builder(8, 3).seed(78).build(&Device::Cpu).unwrap();
    let model = state_dict_of(&[("0", &l0 as &dyn Module), ("2", &l2)]);
    let params: Vec<Tensor> = [&l0, &l2].iter().flat_map(|l| l.parameters()).collect();
    let mut opt = Optimizer::new(params, hyper.clone().weight_decay(0.0)).unwrap();

    let ckpt = Checkpoint::load(fixtures().join(format!("torch_{kind}"))).unwrap();
    assert_eq!(ckpt.progress.step, 3);
    assert!(ckpt.metadata["written_by"]
        .as_str()
        .unwrap()
        .starts_with("torch"));
    ckpt.restore(&model, &mut opt, None).unwrap();
    assert_eq!(opt.groups()[0].hyper, Adam { lr: 0.01, ..hyper });
    assert_eq!(opt.steps(), 3);
    for (name, t) in &model {
        assert_eq!(values(t), values(&ckpt.model[name]), "{name}");
    }

    let cont: BTreeMap<String, Tensor> =
        load_safetensors(fixtures().join(format!("torch_{kind}_continuation.safetensors")))
            .unwrap();
    for i in 3..5 {
        let x = &cont[&format!("x{i}")];
        let y = &cont[&format!("y{i}")];
        let out = l2.forward(&l0.forward(x).unwrap().relu().unwrap()).unwrap();
        out.mse_loss(y, Reduction::Mean)
            .unwrap()
            .backward()
            .unwrap();
        opt.step().unwrap();
        opt.zero_grad();
    }
    let mut compared = 0;
    for (name, t) in &model {
        let err = worst(t, &cont[&format!("model.{name}")]);
        assert!(err < 1e-6, "{kind} {name}: off by {err}");
        compared += 1;
    }
    let state = opt.state_dict_named(&model).unwrap();
    assert_eq!(
        state.param_groups[0].param_names,
        ["0.weight", "0.bias", "2.weight", "2.bias"].map(|n| Some(n.to_string()))
    );
    for (id, p) in &state.state {
        assert_eq!(p.step, 5);
        for (slot, t) in &p.tensors {
            let reference = &cont[&format!("state.{id}.{slot}")];
            // The second moments are ~1e-3: compare them relatively.
            let scale = values(reference).iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = worst(t, reference) / scale.min(1.0);
            assert!(err < 1e-5, "{kind} state.{id}.{slot}: off by {err}");
            compared += 1;
        }
    }
    assert_eq!(compared, 4 + 8);

    if let Ok(out) = std::env::var("LEANGRAD_CHECKPOINT_EXPORT") {
        Checkpoint::capture(&model, &opt, None)
            .unwrap()
            .with_progress(0, 5)
            .save(PathBuf::from(out).join(kind))
            .unwrap();
    }
}

#[test]
fn adam_resumes_from_a_pytorch_checkpoint() {
    resume("adam", Adam::new(0.5).weight_decay(0.001).eps(1e-8));
}

#[test]
fn adamw_resumes_from_a_pytorch_checkpoint() {
    resume("adamw", Adam::adamw(0.5).weight_decay(0.05));
}
