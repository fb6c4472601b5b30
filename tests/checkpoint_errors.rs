//! Checkpoints that cannot be read or do not fit give typed errors naming
//! the file or entry, and change nothing; saving never leaves a damaged
//! checkpoint behind.
use leangrad::io::{state_dict_of, Checkpoint};
use leangrad::nn::{Linear, Module};
use leangrad::ops::Reduction;
use leangrad::optim::{Adam, LrScheduler, Optimizer, Schedule, Scheduler, SequentialLr, Sgd};
use leangrad::{DType, Device, Error, Tensor};
use std::path::{Path, PathBuf};

const CPU: Device = Device::Cpu;

struct Mlp {
    layers: Vec<Linear>,
    state: Vec<(String, Tensor)>,
}

fn mlp(hidden: usize, seed: u64) -> Mlp {
    let layers = vec![
        Linear::builder(3, hidden).seed(seed).build(&CPU).unwrap(),
        Linear::builder(hidden, 2)
            .seed(seed + 1)
            .build(&CPU)
            .unwrap(),
    ];
    let state = state_dict_of(&[("fc0", &layers[0] as &dyn Module), ("fc1", &layers[1])]);
    Mlp { layers, state }
}

impl Mlp {
    fn params(&self) -> Vec<Tensor> {
        self.layers.iter().flat_map(|l| l.parameters()).collect()
    }

    fn train<A: leangrad::optim::CheckpointHyper>(&self, opt: &mut Optimizer<A>) {
        let x = Tensor::randn(&[4, 3], DType::F32, CPU, 5).unwrap();
        let y = Tensor::randn(&[4, 2], DType::F32, CPU, 6).unwrap();
        let h = self.layers[0].forward(&x).unwrap().relu().unwrap();
        let out = self.layers[1].forward(&h).unwrap();
        out.mse_loss(&y, Reduction::Mean)
            .unwrap()
            .backward()
            .unwrap();
        opt.step().unwrap();
        opt.zero_grad();
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-ckpt-err-{}-{name}", std::process::id()));
    for d in [
        dir.clone(),
        dir.with_extension("partial"),
        dir.with_extension("previous"),
    ] {
        let _ = std::fs::remove_dir_all(d);
    }
    dir
}

/// A saved SGD-momentum checkpoint of an MLP with `hidden` units.
fn saved_sgd(name: &str, hidden: usize) -> PathBuf {
    let dir = scratch(name);
    let m = mlp(hidden, 1);
    let mut opt = Optimizer::new(m.params(), Sgd::new(0.1).momentum(0.9)).unwrap();
    m.train(&mut opt);
    Checkpoint::capture(&m.state, &opt, None)
        .unwrap()
        .save(&dir)
        .unwrap();
    dir
}

fn entry_reason(e: Error) -> (String, String) {
    match e {
        Error::Checkpoint { entry, reason } => (entry, reason),
        other => panic!("expected Error::Checkpoint, got {other:?}"),
    }
}

fn momentum_bits(opt: &Optimizer<Sgd>) -> Vec<Vec<u32>> {
    opt.state_dict()
        .unwrap()
        .state
        .values()
        .map(|s| {
            let t = &s.tensors["momentum_buffer"];
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn a_missing_folder_or_file_is_named() {
    let nowhere = std::env::temp_dir().join("leangrad-no-such-checkpoint");
    let (entry, reason) = entry_reason(Checkpoint::load(&nowhere).unwrap_err());
    assert_eq!(Path::new(&entry), nowhere.join("checkpoint.json"));
    assert!(reason.contains("cannot read"), "{reason}");

    let dir = saved_sgd("missing-file", 4);
    std::fs::remove_file(dir.join("optimizer.safetensors")).unwrap();
    let (entry, _) = entry_reason(Checkpoint::load(&dir).unwrap_err());
    assert_eq!(Path::new(&entry), dir.join("optimizer.safetensors"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_json_and_safetensors_are_named() {
    let dir = saved_sgd("damaged", 4);
    let json = dir.join("checkpoint.json");
    let text = std::fs::read_to_string(&json).unwrap();
    std::fs::write(&json, &text[..text.len() / 2]).unwrap();
    let (entry, reason) = entry_reason(Checkpoint::load(&dir).unwrap_err());
    assert_eq!(Path::new(&entry), json);
    assert!(reason.contains("not a valid checkpoint"), "{reason}");

    std::fs::write(&json, text.replace("\"version\": 1", "\"version\": 99")).unwrap();
    let (_, reason) = entry_reason(Checkpoint::load(&dir).unwrap_err());
    assert!(reason.contains("version 99"), "{reason}");

    std::fs::write(&json, &text).unwrap();
    let weights = dir.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() - 3]).unwrap();
    match Checkpoint::load(&dir).unwrap_err() {
        Error::MalformedWeights { what, .. } => assert_eq!(Path::new(&what), weights),
        other => panic!("{other:?}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_foreign_tensor_in_the_optimizer_file_is_named() {
    let dir = saved_sgd("foreign", 4);
    let path = dir.join("optimizer.safetensors");
    let mut tensors: Vec<(String, Tensor)> = leangrad::io::load_safetensors(&path)
        .unwrap()
        .into_iter()
        .collect();
    tensors.push((
        "velocity.0".into(),
        Tensor::zeros(&[2], DType::F32, CPU).unwrap(),
    ));
    leangrad::io::save_safetensors(&path, &tensors).unwrap();
    let (entry, _) = entry_reason(Checkpoint::load(&dir).unwrap_err());
    assert_eq!(entry, "velocity.0");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_wrong_optimizer_kind_is_refused() {
    let dir = saved_sgd("kind", 4);
    let ckpt = Checkpoint::load(&dir).unwrap();
    let m = mlp(4, 2);
    let mut adam = Optimizer::new(m.params(), Adam::new(0.1)).unwrap();
    let (entry, reason) = entry_reason(ckpt.restore(&m.state, &mut adam, None).unwrap_err());
    assert_eq!(entry, "kind");
    assert!(
        reason.contains("SGD") && reason.contains("Adam"),
        "{reason}"
    );

    // An AdamW state does not turn an Adam optimizer into AdamW.
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoints/torch_adamw");
    let adamw = Checkpoint::load(fixture).unwrap();
    let mut plain = Optimizer::new(m.params(), Adam::new(0.1)).unwrap();
    let err = plain.load_state_dict(&adamw.optimizer).unwrap_err();
    let (entry, reason) = entry_reason(err);
    assert_eq!(entry, "param_groups.0");
    assert!(reason.contains("AdamW"), "{reason}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_shape_mismatch_names_the_parameter_and_changes_nothing() {
    let dir = saved_sgd("shape", 4);
    let ckpt = Checkpoint::load(&dir).unwrap();
    let m = mlp(5, 2);
    let mut opt = Optimizer::new(m.params(), Sgd::new(0.3).momentum(0.9)).unwrap();
    m.train(&mut opt);
    let before = momentum_bits(&opt);
    let (entry, reason) = entry_reason(ckpt.restore(&m.state, &mut opt, None).unwrap_err());
    assert_eq!(entry, "state.0.momentum_buffer");
    assert!(reason.contains("`fc0.weight`"), "{reason}");
    assert!(
        reason.contains("[4, 3]") && reason.contains("[5, 3]"),
        "{reason}"
    );
    assert_eq!(momentum_bits(&opt), before);
    assert_eq!(opt.lrs(), [0.3]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_model_that_does_not_fit_rolls_the_optimizer_back() {
    let dir = saved_sgd("rollback", 4);
    let mut ckpt = Checkpoint::load(&dir).unwrap();
    ckpt.model.remove("fc1.bias");
    let m = mlp(4, 2);
    let mut opt = Optimizer::new(m.params(), Sgd::new(0.3).momentum(0.9)).unwrap();
    m.train(&mut opt);
    let before = momentum_bits(&opt);
    match ckpt.restore(&m.state, &mut opt, None).unwrap_err() {
        Error::StateDictMismatch { missing, .. } => assert_eq!(missing, ["fc1.bias"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(momentum_bits(&opt), before);
    assert_eq!(opt.lrs(), [0.3]);
    assert_eq!(opt.steps(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn parameter_counts_and_names_are_checked() {
    let dir = saved_sgd("names", 4);
    let ckpt = Checkpoint::load(&dir).unwrap();
    let m = mlp(4, 2);
    let mut fewer = Optimizer::new(m.params()[..3].to_vec(), Sgd::new(0.1).momentum(0.9)).unwrap();
    let (entry, reason) = entry_reason(ckpt.restore(&m.state, &mut fewer, None).unwrap_err());
    assert_eq!(entry, "param_groups.0.params");
    assert!(
        reason.contains("4 parameters") && reason.contains("has 3"),
        "{reason}"
    );

    // The same shapes in another order: the names tell them apart.
    let mut swapped = m.params();
    swapped.swap(1, 3);
    let mut opt = Optimizer::new(swapped, Sgd::new(0.1).momentum(0.9)).unwrap();
    let (entry, reason) = entry_reason(ckpt.restore(&m.state, &mut opt, None).unwrap_err());
    assert_eq!(entry, "param_groups.0.param_names.1");
    assert!(
        reason.contains("fc0.bias") && reason.contains("fc1.bias"),
        "{reason}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn schedule_kinds_must_match() {
    let dir = scratch("schedule");
    let m = mlp(4, 1);
    let mut opt = Optimizer::new(m.params(), Sgd::new(0.1)).unwrap();
    let warm = Schedule::Linear {
        start_factor: 0.5,
        end_factor: 1.0,
        total_iters: 2,
    };
    let cosine = Schedule::Cosine {
        t_max: 3,
        eta_min: 0.0,
    };
    let mut seq = SequentialLr::new(&mut opt, vec![warm.clone(), cosine], vec![2]).unwrap();
    seq.step(&mut opt).unwrap();
    Checkpoint::capture(&m.state, &opt, Some(&seq))
        .unwrap()
        .save(&dir)
        .unwrap();
    let ckpt = Checkpoint::load(&dir).unwrap();
    let mut single = LrScheduler::new(&mut opt, warm).unwrap();
    let before = single.state();
    let (entry, _) = entry_reason(
        ckpt.restore(&m.state, &mut opt, Some(&mut single))
            .unwrap_err(),
    );
    assert_eq!(entry, "schedule");
    assert_eq!(single.state(), before);

    let no_schedule = Checkpoint::capture(&m.state, &opt, None).unwrap();
    let (entry, _) = entry_reason(
        no_schedule
            .restore(&m.state, &mut opt, Some(&mut seq))
            .unwrap_err(),
    );
    assert_eq!(entry, "schedule");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn saving_replaces_a_checkpoint_whole_and_survives_an_interrupted_save() {
    let dir = saved_sgd("atomic", 4);
    let partial = dir.with_extension("partial");
    let previous = dir.with_extension("previous");
    assert!(!partial.exists() && !previous.exists());
    let first = std::fs::read(dir.join("model.safetensors")).unwrap();

    // A crash while writing left a stale, half-written `.partial`; the
    // checkpoint itself is untouched and the next save goes through.
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("model.safetensors"), b"half").unwrap();
    assert_eq!(
        Checkpoint::load(&dir).unwrap().model.len(),
        4,
        "the checkpoint is whole"
    );
    let m = mlp(4, 9);
    let opt = Optimizer::new(m.params(), Sgd::new(0.1).momentum(0.9)).unwrap();
    Checkpoint::capture(&m.state, &opt, None)
        .unwrap()
        .with_progress(2, 40)
        .with_metadata("note", "second")
        .save(&dir)
        .unwrap();
    assert!(!partial.exists() && !previous.exists());
    let second = Checkpoint::load(&dir).unwrap();
    assert_eq!(second.progress.step, 40);
    assert_eq!(second.metadata["note"], "second");
    assert_ne!(std::fs::read(dir.join("model.safetensors")).unwrap(), first);

    // A crash between the two renames: only `.previous` is left, and it loads.
    std::fs::rename(&dir, &previous).unwrap();
    assert_eq!(Checkpoint::load(&dir).unwrap().progress.step, 40);
    Checkpoint::capture(&m.state, &opt, None)
        .unwrap()
        .with_progress(3, 50)
        .save(&dir)
        .unwrap();
    assert!(!previous.exists());
    assert_eq!(Checkpoint::load(&dir).unwrap().progress.step, 50);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every file under `dir` with its bytes, sorted (sub-folders walked).
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                found.push((p, bytes));
            }
        }
    }
    found.sort();
    found
}

fn sgd_checkpoint() -> Checkpoint {
    let m = mlp(4, 3);
    let opt = Optimizer::new(m.params(), Sgd::new(0.1).momentum(0.9)).unwrap();
    Checkpoint::capture(&m.state, &opt, None).unwrap()
}

#[test]
fn a_folder_leangrad_did_not_write_is_never_replaced() {
    let ckpt = sgd_checkpoint();
    // A folder of the user's: a photo and a sub-folder.
    let dir = scratch("users-folder");
    std::fs::create_dir_all(dir.join("cats")).unwrap();
    std::fs::write(dir.join("photo.jpg"), b"precious").unwrap();
    std::fs::write(dir.join("cats").join("1.png"), b"also precious").unwrap();
    let before = contents(&dir);
    let (entry, reason) = entry_reason(ckpt.save(&dir).unwrap_err());
    assert_eq!(entry, dir.display().to_string());
    assert!(reason.contains("not a checkpoint file"), "{reason}");
    assert_eq!(contents(&dir), before, "the folder is untouched");
    assert!(!dir.with_extension("partial").exists());
    assert!(!dir.with_extension("previous").exists());

    // A folder with a checkpoint's file names but no leangrad manifest.
    let lookalike = scratch("lookalike");
    std::fs::create_dir_all(&lookalike).unwrap();
    std::fs::write(lookalike.join("model.safetensors"), b"mine").unwrap();
    std::fs::write(lookalike.join("checkpoint.json"), br#"{"format": "other"}"#).unwrap();
    let before = contents(&lookalike);
    let (_, reason) = entry_reason(ckpt.save(&lookalike).unwrap_err());
    assert!(reason.contains("not a leangrad checkpoint"), "{reason}");
    assert_eq!(contents(&lookalike), before);

    // A leangrad checkpoint the user put a file into.
    let mixed = saved_sgd("mixed", 4);
    std::fs::write(mixed.join("notes.txt"), b"keep me").unwrap();
    let before = contents(&mixed);
    let (_, reason) = entry_reason(ckpt.save(&mixed).unwrap_err());
    assert!(reason.contains("notes.txt"), "{reason}");
    assert_eq!(contents(&mixed), before);

    // A regular file where the folder would go.
    let file = scratch("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    let (_, reason) = entry_reason(ckpt.save(&file).unwrap_err());
    assert!(reason.contains("is a file"), "{reason}");
    assert_eq!(std::fs::read(&file).unwrap(), b"not a folder");

    // Stale siblings holding something else are not removed either.
    let sibling = scratch("sibling");
    let previous = sibling.with_extension("previous");
    std::fs::create_dir_all(&previous).unwrap();
    std::fs::write(previous.join("thesis.tex"), b"years of work").unwrap();
    let (entry, _) = entry_reason(ckpt.save(&sibling).unwrap_err());
    assert_eq!(entry, previous.display().to_string());
    assert_eq!(
        std::fs::read(previous.join("thesis.tex")).unwrap(),
        b"years of work"
    );
    assert!(!sibling.exists());

    for d in [&dir, &lookalike, &mixed, &previous] {
        std::fs::remove_dir_all(d).unwrap();
    }
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn an_empty_folder_takes_a_checkpoint_and_a_half_removed_previous_is_cleaned_up() {
    let ckpt = sgd_checkpoint();
    let dir = scratch("empty");
    std::fs::create_dir_all(&dir).unwrap();
    ckpt.save(&dir).unwrap();
    assert_eq!(Checkpoint::load(&dir).unwrap().model.len(), 4);

    // A kill while `.previous` was being removed left part of it.
    let previous = dir.with_extension("previous");
    std::fs::create_dir_all(&previous).unwrap();
    std::fs::write(previous.join("optimizer.safetensors"), b"half").unwrap();
    ckpt.clone().with_progress(1, 7).save(&dir).unwrap();
    assert!(!previous.exists(), "the leftover is cleaned up");
    assert_eq!(Checkpoint::load(&dir).unwrap().progress.step, 7);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `checkpoint.json` of `dir` with `edit` applied.
fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("checkpoint.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
}

#[test]
fn counts_past_two_to_the_53_are_refused_by_name() {
    let dir = scratch("counts");
    let m = mlp(4, 1);
    let mut opt = Optimizer::new(m.params(), Adam::new(0.01)).unwrap();
    m.train(&mut opt);
    Checkpoint::capture(&m.state, &opt, None)
        .unwrap()
        .save(&dir)
        .unwrap();
    let max = serde_json::json!(u64::MAX);
    for (key, edit) in [
        (
            "progress.step",
            Box::new(|j: &mut serde_json::Value| j["progress"]["step"] = max.clone())
                as Box<dyn Fn(&mut serde_json::Value)>,
        ),
        (
            "progress.epoch",
            Box::new(|j: &mut serde_json::Value| j["progress"]["epoch"] = max.clone()),
        ),
        (
            "optimizer.state.0.step",
            Box::new(|j: &mut serde_json::Value| {
                j["optimizer"]["state"]["0"]["step"] = max.clone()
            }),
        ),
    ] {
        let copy = scratch(&format!("counts-{key}"));
        std::fs::create_dir_all(&copy).unwrap();
        for f in [
            "model.safetensors",
            "optimizer.safetensors",
            "checkpoint.json",
        ] {
            std::fs::copy(dir.join(f), copy.join(f)).unwrap();
        }
        edit_manifest(&copy, edit);
        let (_, reason) = entry_reason(Checkpoint::load(&copy).unwrap_err());
        assert!(reason.contains(key), "{key}: {reason}");
        std::fs::remove_dir_all(&copy).unwrap();
    }

    // At the bound, Adam steps on with finite weights.
    edit_manifest(&dir, |j| {
        j["optimizer"]["state"]["0"]["step"] = serde_json::json!(1u64 << 53);
    });
    let ckpt = Checkpoint::load(&dir).unwrap();
    let fresh = mlp(4, 2);
    let mut opt = Optimizer::new(fresh.params(), Adam::new(0.01)).unwrap();
    ckpt.restore(&fresh.state, &mut opt, None).unwrap();
    fresh.train(&mut opt);
    for p in fresh.params() {
        assert!(p.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
