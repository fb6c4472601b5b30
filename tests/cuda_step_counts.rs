//! What one training step asks of the GPU, counted exactly on the
//! simulated GPU: kernel launches, cuBLAS calls, synchronisations, copies
//! each way, allocations and frees. These counts are deterministic, so a
//! change that adds a synchronisation, a host round trip or a per-item
//! loop fails here; when a change moves them on purpose, update the table
//! (and say why in the commit).
//!
//! On a real GPU the counts cannot be read (the simulator counts them): the
//! steps still run and must give a finite loss.

mod cuda_common;

use leangrad::cuda::profiler;
use leangrad::memory_plan::{find_model, parse_case, OptimizerKind, StepRunner, StepSpec};
use leangrad::{DType, Device};
use std::sync::Mutex;

/// The simulator's profile is one per process: tests that count hold this
/// while they run (the test harness runs tests on parallel threads).
static PROFILE: Mutex<()> = Mutex::new(());

/// (model, batch, image size, case) → launches, cuBLAS calls, syncs, H2D,
/// D2H, allocations, frees of one step (SGD with momentum, the batch
/// uploaded and the loss read back). The simulator's own wait before its
/// summary is not counted.
const EXPECTED: [(&str, usize, usize, &str, [u64; 7]); 3] = [
    // Nothing inside the step crosses to the host: BatchNorm's statistics,
    // running statistics and `num_batches_tracked` stay on the device (a
    // moments, a statistics and a normalise launch per call, and the
    // saved scale), the loss is reduced there and backward's seed is a
    // fill. One H2D (the batch), one sync and two D2H where the loss is
    // read: the loss and the device's check record (a target out of range
    // would be reported there). ReLU and its 1-bit mask are one launch:
    // inside each residual branch (8 of them) the BatchNorm before it
    // makes both in its own launch, and each block's residual add makes
    // them in its own.
    // Every convolution is one implicit-GEMM launch per pass (two for a
    // weight gradient whose reduction is split: here every layer's but
    // layer4's (a partial sum over the budget, or 2 positions), whose few
    // output tiles split over the batch's
    // positions, down to 2 per range; a memset, not a launch, zeroes the
    // counters of ranges summed one after another), whatever the batch: the
    // cuBLAS calls left are the classifier's. BatchNorm's sums over a channel run in pieces of whole
    // samples where a layer has at most 256 channels (15 of ResNet-18's
    // 20), so that few channels still fill the GPU: the moments, the input
    // gradient and the parameter gradients each take a second launch that
    // joins the pieces, and a scratch buffer of the pieces' sums. SGD
    // updates the 62 parameters in two multi-tensor launches (32 each).
    ("resnet18", 2, 32, "all", [301, 3, 1, 1, 2, 472, 472]),
    (
        "resnet18",
        2,
        32,
        "input-bn-eval",
        [164, 2, 1, 1, 2, 232, 232],
    ),
    // Twice the batch, the same work list.
    (
        "resnet18",
        4,
        32,
        "input-bn-eval",
        [164, 2, 1, 1, 2, 232, 232],
    ),
];

#[test]
fn a_training_steps_launches_syncs_and_copies_are_as_counted() {
    let dev = cuda_or_skip!("a_training_steps_launches_syncs_and_copies_are_as_counted");
    let _one_at_a_time = PROFILE.lock().unwrap_or_else(|e| e.into_inner());
    let mut wrong = Vec::new();
    for (name, batch, size, case, expected) in EXPECTED {
        let spec = StepSpec {
            batch,
            input: find_model(name)
                .unwrap()
                .step_input(Some(size), None)
                .unwrap(),
            classes: 10,
            dtype: DType::F32,
            optimizer: OptimizerKind::Sgd,
            fused: false,
            checkpoint: false,
            optimizer_state: leangrad::optim::StateFormat::Full,
            autocast: None,
            case: parse_case(case).unwrap(),
            device: Device::Cuda(0),
        };
        let mut runner = StepRunner::new(name, &spec).unwrap();
        let Some((got, table)) = counts_of_step(&dev, || runner.step().unwrap()) else {
            continue;
        };
        println!("{name} b{batch} {size}² {case}: {got:?}");
        if got != expected {
            wrong.push(format!(
                "{name} batch {batch} {size}² {case}: counted {got:?}, expected {expected:?} \
                 (launches, cuBLAS calls, syncs, H2D, D2H, allocs, frees)\n{table}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Launches, cuBLAS calls, syncs, H2D, D2H, allocations and frees of the
/// second of two runs of `step` (the first loads the kernels; the second
/// is what every later step does), with the simulator's summary table;
/// `None` on a real GPU, where they cannot be read (the steps still run).
fn counts_of_step(
    dev: &std::sync::Arc<leangrad::cuda::CudaDevice>,
    mut step: impl FnMut() -> f64,
) -> Option<(Vec<u64>, String)> {
    assert!(step().is_finite());
    if !dev.is_simulated() {
        assert!(step().is_finite());
        return None;
    }
    profiler::simulator_profile_reset(dev).unwrap();
    assert!(step().is_finite());
    let summary = profiler::simulator_profile_summary(dev).unwrap();
    let c = &summary["counts"];
    let counts = [
        "launches",
        "cublas_calls",
        "syncs",
        "h2d",
        "d2h",
        "allocs",
        "frees",
    ]
    .iter()
    .map(|k| c[k].as_u64().expect("a count"))
    .collect();
    let table = summary["table_h200"].as_str().unwrap_or("").to_string();
    Some((counts, table))
}

/// Token models: the ids go up once, and nothing comes back until the loss
/// is read — the embedding reads its indices on the device (forward and the
/// backward's row grouping) and GPT-2's chunked head keeps each chunk's
/// losses there. One sync; two D2H (the loss and the check record, which
/// would report an id or a label out of range).
#[test]
fn a_token_models_step_waits_for_the_host_only_where_its_loss_is_read() {
    use leangrad::models::{BertClassifier, BertConfig, Gpt2, Gpt2Config, TextInput};
    use leangrad::nn::Module;
    use leangrad::ops::CrossEntropyOptions;
    use leangrad::optim::{Optimizer, Sgd};
    use leangrad::Tensor;
    let dev = cuda_or_skip!("a_token_models_step_waits_for_the_host_only_where_its_loss_is_read");
    let _one_at_a_time = PROFILE.lock().unwrap_or_else(|e| e.into_inner());
    let cuda = Device::Cuda(0);
    let ids = |vocab: i64| {
        Tensor::from_vec(
            (0..16).map(|i| i * 7 % vocab).collect(),
            &[2, 8],
            Device::Cpu,
        )
        .unwrap()
    };
    let params = |m: &dyn Module| m.named_parameters().into_iter().map(|(_, p)| p);

    let bert = BertClassifier::new(BertConfig::tiny(), 3, DType::F32, cuda, 1).unwrap();
    let bert_ids = ids(50);
    let labels = Tensor::from_vec(vec![0i64, 2], &[2], Device::Cpu)
        .unwrap()
        .to_device(cuda)
        .unwrap();
    let mut opt = Optimizer::new(params(&bert), Sgd::new(0.01).momentum(0.9)).unwrap();
    let bert_counts = counts_of_step(&dev, || {
        let x = bert_ids.to_device(cuda).unwrap();
        let loss = bert
            .forward(&x)
            .unwrap()
            .cross_entropy(&labels, CrossEntropyOptions::default())
            .unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
        loss.to_scalar().unwrap()
    });

    let gpt2 = Gpt2::new(Gpt2Config::tiny(), DType::F32, cuda, 2).unwrap();
    let vocab = Gpt2Config::tiny().vocab_size as i64;
    let gpt2_ids = ids(vocab);
    let next = Tensor::from_vec(
        (0..16).map(|i| (i * 5 + 1) % vocab).collect(),
        &[16],
        Device::Cpu,
    )
    .unwrap()
    .to_device(cuda)
    .unwrap();
    let wte = gpt2
        .named_parameters()
        .into_iter()
        .find(|(n, _)| n == "wte.weight")
        .expect("GPT-2's token embedding")
        .1;
    let mut opt = Optimizer::new(params(&gpt2), Sgd::new(0.01).momentum(0.9)).unwrap();
    let gpt2_counts = counts_of_step(&dev, || {
        let x = gpt2_ids.to_device(cuda).unwrap();
        // Chunks of 5 rows: 4 chunks of the head's logits.
        let h = gpt2.hidden(TextInput::Ids(&x)).unwrap();
        let loss = h
            .reshape(&[16, h.shape()[2]])
            .unwrap()
            .linear_cross_entropy_in_chunks(&wte, None, &next, CrossEntropyOptions::default(), 5)
            .unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
        loss.to_scalar().unwrap()
    });
    // Launches, cuBLAS calls, syncs, H2D, D2H, allocations, frees (batch
    // 2 × 8 tokens; GPT-2's head in 4 chunks of at most 5 rows; the
    // embedding adds its rows into the head's gradient of the tied `wte`:
    // no buffer of its own, no addition after).
    let expected = [
        ("bert tiny", bert_counts, [111, 42, 1, 1, 2, 170, 170]),
        ("gpt2 tiny", gpt2_counts, [131, 40, 1, 1, 2, 210, 210]),
    ];
    for (name, got, want) in expected {
        let Some((got, table)) = got else { continue };
        println!("{name}: {got:?}");
        assert_eq!(
            got, want,
            "{name}: launches, cuBLAS, syncs, H2D, D2H, allocs, frees\n{table}"
        );
    }
}
