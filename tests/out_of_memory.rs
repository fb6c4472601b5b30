//! Running out of host memory is a typed error, never an abort. Every
//! request here is terabytes: it is refused before anything is allocated
//! (no test touches more than a few MiB), on any machine that holds less
//! than a few TiB.
use leangrad::demo::{self, DemoOptions};
use leangrad::memory::Ledger;
use leangrad::{DType, Device, Error, Result, Tensor};
use std::ops::ControlFlow;

const CPU: Device = Device::Cpu;
const TIB: usize = 1 << 40;

/// The request's bytes of an `Error::OutOfMemory` on `device`, checking
/// that its summary says why and carries the ledger's table.
fn oom<T: std::fmt::Debug>(r: Result<T>, device: Device) -> usize {
    match r {
        Err(Error::OutOfMemory {
            device: d,
            requested,
            summary,
            ..
        }) => {
            assert_eq!(d, device);
            assert!(summary.contains("total"), "no ledger table: {summary}");
            requested
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}

#[test]
fn a_huge_host_tensor_is_an_out_of_memory_error_with_the_ledger() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let kept = Tensor::zeros(&[256], DType::F32, CPU).unwrap();
    match Tensor::zeros(&[TIB], DType::F32, CPU) {
        Err(Error::OutOfMemory {
            device,
            requested,
            live,
            summary,
        }) => {
            assert_eq!((device, requested, live), (CPU, 4 * TIB, 1024));
            assert!(summary.contains("MemAvailable"), "{summary}");
            assert!(summary.contains("activations"), "{summary}");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // Every way of making host data: the request is the tensor's bytes
    // (random numbers are written straight into the tensor, no f64 copy).
    assert_eq!(oom(Tensor::ones(&[TIB], DType::F64, CPU), CPU), 8 * TIB);
    assert_eq!(
        oom(Tensor::full(&[TIB], 2.0, DType::BF16, CPU), CPU),
        2 * TIB
    );
    assert_eq!(oom(Tensor::randn(&[TIB], DType::F32, CPU, 0), CPU), 4 * TIB);
    assert_eq!(oom(Tensor::rand(&[TIB], DType::F16, CPU, 0), CPU), 2 * TIB);
    let range = Tensor::rand_range(&[2, TIB], -1.0, 1.0, DType::F32, CPU, 0);
    assert_eq!(oom(range, CPU), 8 * TIB);
    assert_eq!(oom(Tensor::arange(TIB, DType::I64, CPU), CPU), 8 * TIB);
    // Nothing was counted, and the host is still usable.
    assert_eq!(ledger.live(CPU), 1024);
    assert_eq!(
        kept.add(&kept).unwrap().to_vec::<f32>().unwrap(),
        [0.0; 256]
    );
}

#[test]
fn kernels_report_outputs_the_host_cannot_hold() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let col = Tensor::ones(&[1 << 20, 1], DType::F32, CPU).unwrap();
    let row = Tensor::ones(&[1, 1 << 20], DType::F32, CPU).unwrap();
    let live = ledger.live(CPU);
    // A [2^20, 2^20] f32 product: 4 TiB of output.
    assert_eq!(oom(col.matmul(&row), CPU), 4 * TIB);
    // Broadcasting reads through 8-byte offsets of the 2^40 elements: the
    // first buffer asked for is one of them.
    assert!(oom(col.add(&row), CPU) >= 4 * TIB);
    assert!(oom(col.gt(&row), CPU) >= TIB);
    let view = col.broadcast_to(&[1 << 20, 1 << 20]).unwrap();
    assert!(oom(view.contiguous(), CPU) >= 4 * TIB);
    assert!(oom(view.to_dtype(DType::F64), CPU) >= 8 * TIB);
    assert!(oom(view.to_vec::<f32>(), CPU) >= 4 * TIB);
    assert_eq!(ledger.live(CPU), live);
}

#[test]
fn sizes_past_usize_are_typed_errors() {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let _kept = Tensor::zeros(&[1], DType::F32, Device::Meta).unwrap();
    // The element count itself overflows: a shape error, on every device.
    for device in [CPU, Device::Meta] {
        let r = Tensor::zeros(&[TIB, TIB, TIB], DType::F32, device);
        assert!(
            matches!(&r, Err(Error::InvalidArgument { msg, .. }) if msg.contains("usize")),
            "{r:?}"
        );
    }
    // The count fits but its bytes do not: out of memory, even on meta.
    assert_eq!(
        oom(
            Tensor::zeros(&[1 << 62], DType::F32, Device::Meta),
            Device::Meta
        ),
        usize::MAX
    );
    // A broadcast whose result cannot be counted is refused before any
    // kernel runs (meta tensors of 2^40 elements hold no data).
    let a = Tensor::zeros(&[TIB, 1], DType::F32, Device::Meta).unwrap();
    let b = Tensor::zeros(&[1, TIB], DType::F32, Device::Meta).unwrap();
    assert!(matches!(a.add(&b), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.matmul(&b), Err(Error::InvalidArgument { .. })));
}

#[test]
fn the_demo_refuses_what_the_host_cannot_hold() {
    let opts = DemoOptions {
        hidden: 10_000_000,
        steps: 1,
        ..DemoOptions::default()
    };
    // The library run fails at the first weight (4·10^14 bytes of fc2).
    let r = demo::run(&opts, |_, _| ControlFlow::Continue(()));
    assert_eq!(oom(r.map(|d| d.accuracy), CPU), 400_000_000_000_000);
    // The meta prediction (what the command checks first) sees it coming:
    // at least the three weight matrices and fc2's gradient.
    let needed = demo::predict_peak(&opts).unwrap();
    assert!(needed >= 2 * 400_000_000_000_000, "{needed}");
    match CPU.check_fits("the demo", needed) {
        Err(e @ Error::WillNotFit { .. }) => {
            let text = e.to_string();
            assert!(text.starts_with("the demo needs "), "{text}");
            assert!(text.contains("short"), "{text}");
        }
        other => panic!("expected WillNotFit, got {other:?}"),
    }
    // The default demo fits: its prediction is its measured peak.
    let small = DemoOptions {
        steps: 2,
        ..DemoOptions::default()
    };
    let predicted = demo::predict_peak(&small).unwrap();
    CPU.check_fits("the demo", predicted).unwrap();
    let run = demo::run(&small, |_, _| ControlFlow::Continue(())).unwrap();
    let measured = run
        .memory
        .devices
        .iter()
        .find(|d| d.device == "cpu")
        .unwrap()
        .peak_total;
    assert_eq!(predicted, measured);
}
