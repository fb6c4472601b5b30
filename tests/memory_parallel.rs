//! One rank's step under data parallel, as `leangrad memory --world-size`
//! predicts it: on the meta device exactly what the same rank allocates on
//! the CPU (a group that does not communicate runs the same buckets and
//! ownership), and the figures keep their relations — replicated state as
//! on one device, sharded state split over the ranks with each parameter's
//! state on one rank, the fused step's gradients bounded by its buckets.

use leangrad::memory_plan::{plan_parallel, OptimizerKind, ParallelSpec, StepInput, StepSpec};
use leangrad::models::Case;
use leangrad::optim::StateFormat;
use leangrad::{DType, Device};

fn spec(optimizer: OptimizerKind, fused: bool, device: Device) -> StepSpec {
    StepSpec {
        batch: 2,
        input: StepInput::Image {
            channels: 3,
            size: 32,
        },
        classes: 10,
        dtype: DType::F32,
        optimizer,
        fused,
        checkpoint: false,
        optimizer_state: StateFormat::Full,
        autocast: None,
        case: "all".parse::<Case>().expect("case"),
        device,
    }
}

const FOUR_SHARDED: ParallelSpec = ParallelSpec {
    world_size: 4,
    shard_optimizer: true,
};

#[test]
fn a_ranks_predicted_step_is_what_it_allocates_on_the_cpu() {
    for fused in [false, true] {
        let at = |device| {
            plan_parallel(
                "resnet18",
                &spec(OptimizerKind::Adam, fused, device),
                FOUR_SHARDED,
            )
            .unwrap()
        };
        let (meta, cpu) = (at(Device::Meta), at(Device::Cpu));
        assert_eq!(meta.single_device, cpu.single_device, "fused {fused}");
        assert_eq!(meta.replicated, cpu.replicated, "fused {fused}");
        assert_eq!(meta.sharded, cpu.sharded, "fused {fused}");
    }
}

#[test]
fn sharded_state_is_split_over_the_ranks_and_fused_gradients_stay_in_buckets() {
    for fused in [false, true] {
        let plan = plan_parallel(
            "resnet18",
            &spec(OptimizerKind::Adam, fused, Device::Meta),
            FOUR_SHARDED,
        )
        .unwrap();
        let (one, rep) = (plan.single_device, plan.replicated);
        let sharded = plan.sharded.expect("asked for");
        // Replicated: every rank keeps all of Adam's state.
        assert_eq!(rep.optimizer_state_bytes, one.optimizer_state_bytes);
        // Sharded: the largest rank's share, within the largest parameter's
        // state (layer4's 512·512·3·3 convolution, two f32 moments) of an
        // even split, as dealing largest first to the least loaded keeps it.
        let state = one.optimizer_state_bytes;
        let largest_param_state = 2 * 512 * 512 * 9 * 4;
        assert!(
            sharded.optimizer_state_bytes + largest_param_state >= state / 4,
            "{sharded:?}"
        );
        assert!(
            sharded.optimizer_state_bytes <= state / 4 + largest_param_state,
            "{sharded:?}"
        );
        assert!(sharded.peak_bytes < rep.peak_bytes, "{sharded:?} {rep:?}");
        if fused {
            // One largest parameter's gradient on one device; a bucket
            // being filled and one in flight (25 MiB each at most, or one
            // parameter) under data parallel.
            assert!(rep.gradient_peak_bytes <= 2 * (25 << 20), "{rep:?}");
            assert!(
                rep.gradient_peak_bytes >= one.gradient_peak_bytes,
                "{rep:?} {one:?}"
            );
        } else {
            // The usual path keeps every gradient until the step.
            assert_eq!(rep.gradient_peak_bytes, one.gradient_peak_bytes);
        }
    }
}

#[test]
fn a_world_of_one_rank_is_the_single_device_step_and_zero_ranks_are_refused() {
    let plan = plan_parallel(
        "resnet18",
        &spec(OptimizerKind::Sgd, true, Device::Meta),
        ParallelSpec {
            world_size: 1,
            shard_optimizer: false,
        },
    )
    .unwrap();
    assert_eq!(plan.replicated.peak_bytes, plan.single_device.peak_bytes);
    let zero = ParallelSpec {
        world_size: 0,
        shard_optimizer: false,
    };
    assert!(plan_parallel(
        "resnet18",
        &spec(OptimizerKind::Sgd, true, Device::Meta),
        zero
    )
    .is_err());
}
