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
    // cuBLAS calls left are the classifier's. Still per-parameter SGD
    // launches. BatchNorm's sums over a channel run in pieces of whole
    // samples where a layer has at most 256 channels (15 of ResNet-18's
    // 20), so that few channels still fill the GPU: the moments, the input
    // gradient and the parameter gradients each take a second launch that
    // joins the pieces, and a scratch buffer of the pieces' sums.
    ("resnet18", 2, 32, "all", [361, 3, 1, 1, 2, 472, 472]),
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
            case: parse_case(case).unwrap(),
            device: Device::Cuda(0),
        };
        let mut runner = StepRunner::new(name, &spec).unwrap();
        // The first step loads the kernels; the second is what every
        // later step does.
        assert!(runner.step().unwrap().is_finite());
        if !dev.is_simulated() {
            assert!(runner.step().unwrap().is_finite());
            continue;
        }
        profiler::simulator_profile_reset(&dev).unwrap();
        assert!(runner.step().unwrap().is_finite());
        let summary = profiler::simulator_profile_summary(&dev).unwrap();
        let c = &summary["counts"];
        let got: Vec<u64> = [
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
        println!("{name} b{batch} {size}² {case}: {got:?}");
        if got != expected {
            wrong.push(format!(
                "{name} batch {batch} {size}² {case}: counted {got:?}, expected {expected:?} \
                 (launches, cuBLAS calls, syncs, H2D, D2H, allocs, frees)\n{}",
                summary["table_h200"].as_str().unwrap_or("")
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
