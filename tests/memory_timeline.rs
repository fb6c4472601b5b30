//! The ledger's timeline and the breakdown at the peak: replaying the
//! recorded events from nothing gives the ledger's own live, peak,
//! per-category peak and at-peak numbers exactly, on the meta device and
//! on the CPU (whose timelines are the same event for event); gradients are
//! split by where they go (parameter, input, in flight); recording is off
//! unless asked for.

mod tiny_models;

use leangrad::autograd::SavePolicy;
use leangrad::memory::{Category, DeviceReport, EventKind, Ledger, Phase, TimelineEvent};
use leangrad::memory_plan::{run_step, run_step_recording, OptimizerKind, StepMemory, StepSpec};
use leangrad::models::Case;
use leangrad::{DType, Device, Tensor};
use std::collections::HashMap;

fn spec(case: &str, input: leangrad::memory_plan::StepInput, device: Device) -> StepSpec {
    StepSpec {
        batch: 2,
        input,
        classes: 5,
        dtype: DType::F32,
        optimizer: OptimizerKind::Sgd,
        fused: false,
        checkpoint: false,
        optimizer_state: leangrad::optim::StateFormat::Full,
        autocast: None,
        case: case.parse::<Case>().expect("case"),
        device,
    }
}

/// Replays `events` with plain arithmetic, independently of the library:
/// checks each event's recorded `live` against allocations minus frees so
/// far, and the report's peak, per-category peaks, end state and
/// breakdown at the peak against the replay.
fn check_replay(what: &str, events: &[TimelineEvent], report: &DeviceReport) {
    assert!(!events.is_empty(), "{what}: no events");
    let mut live: HashMap<Category, i128> = HashMap::new();
    let mut peak_by_category: HashMap<Category, i128> = HashMap::new();
    let (mut total, mut peak) = (0i128, 0i128);
    let mut at_peak: Option<(HashMap<Category, i128>, &TimelineEvent)> = None;
    for (i, e) in events.iter().enumerate() {
        let b = e.bytes as i128;
        match e.kind {
            EventKind::Alloc => {
                total += b;
                *live.entry(e.category).or_default() += b;
            }
            EventKind::Free => {
                total -= b;
                *live.entry(e.category).or_default() -= b;
            }
            EventKind::Move => {
                let from = e.from.expect("a move names the category it left");
                assert_ne!(from, e.category, "{what}: event {i} moves nowhere");
                *live.entry(from).or_default() -= b;
                *live.entry(e.category).or_default() += b;
            }
        }
        assert!(
            live.values().all(|&v| v >= 0),
            "{what}: event {i} below zero"
        );
        assert_eq!(
            total, e.live as i128,
            "{what}: event {i}: allocs − frees ≠ live"
        );
        for (&c, &v) in &live {
            let p = peak_by_category.entry(c).or_default();
            *p = (*p).max(v);
        }
        if total > peak {
            peak = total;
            at_peak = Some((live.clone(), e));
        }
    }
    assert_eq!(peak, report.peak_total as i128, "{what}: peak");
    assert_eq!(total, report.live_total as i128, "{what}: live at the end");
    let (at, event) = at_peak.expect("a peak");
    for c in Category::ALL {
        let get = |m: &HashMap<Category, i128>| m.get(&c).copied().unwrap_or(0);
        assert_eq!(get(&live), report.live.get(c) as i128, "{what}: live {c:?}");
        assert_eq!(
            get(&peak_by_category),
            report.peak.get(c) as i128,
            "{what}: peak {c:?}"
        );
        assert_eq!(
            get(&at),
            report.at_peak.bytes.get(c) as i128,
            "{what}: at peak {c:?}"
        );
    }
    // The rows at the peak add up to the peak, and name what ran then.
    assert_eq!(report.at_peak.bytes.total(), report.peak_total, "{what}");
    assert_eq!(
        report.at_peak.phase, event.phase,
        "{what}: phase at the peak"
    );
    assert_eq!(
        report.at_peak.scope,
        event.scope.as_deref().unwrap_or(""),
        "{what}"
    );
    assert_eq!(report.at_peak.op, event.op, "{what}: op at the peak");
    let allocs = events.iter().filter(|e| e.kind == EventKind::Alloc).count();
    assert_eq!(allocs as u64, report.allocations, "{what}: allocations");
}

fn recorded(step: &StepMemory) -> &[TimelineEvent] {
    step.timeline.as_deref().expect("recorded")
}

/// Events without their device, for comparing meta with the CPU.
fn deviceless(events: &[TimelineEvent]) -> Vec<TimelineEvent> {
    events
        .iter()
        .map(|e| TimelineEvent {
            device: Device::Meta,
            ..e.clone()
        })
        .collect()
}

#[test]
fn timeline_replays_to_the_ledger_on_meta_and_cpu() {
    let models = tiny_models::models();
    for &index in &[0usize, 5] {
        let (name, build, input) = &models[index];
        for case in ["all", "input-bn-eval"] {
            for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
                let what = format!("{name} {case} {policy:?}");
                let run = |device| {
                    run_step_recording(build.as_ref(), &spec(case, *input, device), policy, true)
                        .unwrap_or_else(|e| panic!("{what} on {device}: {e}"))
                };
                let (meta, cpu) = (run(Device::Meta), run(Device::Cpu));
                check_replay(&format!("{what} meta"), recorded(&meta), &meta.report);
                check_replay(&format!("{what} cpu"), recorded(&cpu), &cpu.report);
                let (m, c) = (deviceless(recorded(&meta)), deviceless(recorded(&cpu)));
                let first = m.iter().zip(&c).position(|(a, b)| a != b);
                assert_eq!(
                    (m.len(), first),
                    (c.len(), None),
                    "{what}: meta and cpu timelines differ first at {:?}",
                    first.map(|i| (&m[i], &c[i]))
                );
                // The step's phases, in order; the optimizer's state is
                // made in its own phase when parameters train.
                let phases: Vec<Phase> = recorded(&meta).iter().map(|e| e.phase).collect();
                let mut order = phases.clone();
                order.dedup();
                let want: &[Phase] = if case == "all" {
                    &[
                        Phase::Setup,
                        Phase::Forward,
                        Phase::Backward,
                        Phase::Optimizer,
                    ]
                } else {
                    &[Phase::Setup, Phase::Forward, Phase::Backward]
                };
                assert_eq!(order, want, "{what}: phases");
                // What the input case keeps is the input's gradient, not a
                // parameter's; the other way round when only parameters train.
                let r = &meta.report;
                if case == "all" {
                    assert!(r.peak.parameter_gradients > 0, "{what}");
                    assert_eq!(r.peak.input_gradients, 0, "{what}");
                } else {
                    assert_eq!(r.peak.parameter_gradients, 0, "{what}");
                    let image = match input {
                        leangrad::memory_plan::StepInput::Image { channels, size } => {
                            2 * channels * size * size * 4
                        }
                        _ => unreachable!("an image model"),
                    };
                    assert_eq!(r.live.input_gradients, image, "{what}");
                }
            }
        }
    }
}

#[test]
fn the_timeline_is_off_unless_asked_for() {
    let (_, build, input) = tiny_models::models().swap_remove(0);
    let plain = run_step(
        build.as_ref(),
        &spec("all", input, Device::Meta),
        SavePolicy::Lean,
    )
    .expect("step");
    assert!(plain.timeline.is_none());
    let recorded = run_step_recording(
        build.as_ref(),
        &spec("all", input, Device::Meta),
        SavePolicy::Lean,
        true,
    )
    .expect("step");
    // Recording changes nothing the report says.
    assert_eq!(plain.report, recorded.report);
    let ledger = Ledger::new();
    {
        let _in = ledger.enter();
        let _t = Tensor::zeros(&[8], DType::F32, Device::Cpu).expect("zeros");
    }
    assert!(ledger.timeline().is_empty());
    assert_eq!(ledger.peak(Device::Cpu), 32);
}

#[test]
fn leaf_gradients_are_split_into_parameter_and_input_gradients() {
    let ledger = Ledger::new().record_timeline(true);
    let _in = ledger.enter();
    let cpu = Device::Cpu;
    let w = Tensor::randn(&[4, 3], DType::F32, cpu, 0)
        .and_then(|t| t.into_parameter())
        .expect("parameter");
    let x = Tensor::randn(&[2, 4], DType::F32, cpu, 1)
        .and_then(|t| t.set_requires_grad(true))
        .expect("input");
    let loss = x.matmul(&w).and_then(|y| y.sum_all()).expect("forward");
    ledger.set_phase(Phase::Backward);
    loss.backward().expect("backward");
    assert_eq!(ledger.live_in(cpu, Category::ParameterGradient), 4 * 3 * 4);
    assert_eq!(ledger.live_in(cpu, Category::InputGradient), 2 * 4 * 4);
    assert_eq!(ledger.live_in(cpu, Category::IntermediateGradient), 0);
    assert_eq!(ledger.live_gradients(cpu), (4 * 3 + 2 * 4) * 4);
    // Both leaf gradients were made as gradients in flight, then moved.
    let moves: Vec<(Option<Category>, Category, usize)> = ledger
        .timeline()
        .iter()
        .filter(|e| e.kind == EventKind::Move && e.phase == Phase::Backward)
        .map(|e| (e.from, e.category, e.bytes))
        .collect();
    assert!(
        moves.contains(&(
            Some(Category::IntermediateGradient),
            Category::ParameterGradient,
            48
        )),
        "{moves:?}"
    );
    assert!(
        moves.contains(&(
            Some(Category::IntermediateGradient),
            Category::InputGradient,
            32
        )),
        "{moves:?}"
    );
    let report = &ledger.report().devices[0];
    check_replay("matmul", &ledger.timeline(), report);
}
