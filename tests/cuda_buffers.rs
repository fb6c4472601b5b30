//! CUDA device and buffers through the public API: availability answers,
//! host↔device copies for every dtype, ledger counts equal to the CPU's,
//! the typed out-of-memory error, and the driver's memory view. (`fill`, a
//! launch wrapper, is tested in the crate: `src/cuda/tests/elementwise.rs`.)
//! Without a GPU the device tests print `skipped: no CUDA device (…)`.

mod cuda_common;

use leangrad::cuda::{CudaBuffer, CudaDevice};
use leangrad::memory::{Category, Ledger};
use leangrad::{DType, Device, Error, Tensor};

#[test]
fn availability_is_a_typed_answer_never_a_panic() {
    // Runs everywhere: with or without CUDA the answers must agree.
    match CudaDevice::get(0) {
        Ok(d) => {
            assert_eq!(Device::cuda_if_available(0), Device::Cuda(0));
            assert!(Device::Cuda(0).check_available().is_ok());
            println!("CUDA device 0: {d:?} {}", d.name().unwrap());
        }
        Err(e) => {
            assert!(
                !cuda_common::cuda_required(),
                "LEANGRAD_REQUIRE_CUDA=1 but no CUDA device: {e}"
            );
            assert!(matches!(e, Error::DeviceUnavailable { .. }), "{e}");
            assert_eq!(Device::cuda_if_available(0), Device::Cpu);
            assert!(!Device::Cuda(0).is_available());
            println!("no CUDA device: {e}");
        }
    }
    let far = Device::Cuda(4096).check_available().unwrap_err();
    assert!(matches!(far, Error::DeviceUnavailable { .. }), "{far}");
    assert!(Device::Cpu.is_available());
}

#[test]
fn copies_round_trip_for_every_dtype_and_odd_size() {
    let dev = cuda_or_skip!("copies_round_trip");
    for dtype in cuda_common::ALL {
        for n in [0usize, 1, 7, 1023, 4099] {
            let hi = if dtype.is_float() { 100.0 } else { 250.0 };
            let t =
                cuda_common::cpu_rand(&[n], -hi * f64::from(dtype.is_float()), hi, dtype, n as u64);
            let b = cuda_common::upload(&dev, &t);
            assert_eq!((b.dtype(), b.len()), (dtype, n));
            let back = b.to_cpu_data().unwrap();
            assert_eq!(back.dtype(), dtype);
            assert_eq!(
                back.to_vec_as::<f64>(),
                t.to_f64_vec().unwrap(),
                "{dtype:?} x {n}"
            );
            let c = b.try_clone().unwrap();
            assert_eq!(cuda_common::download(&c), t.to_f64_vec().unwrap());
        }
    }
}

#[test]
fn ledger_counts_the_same_bytes_as_the_cpu() {
    let dev = cuda_or_skip!("ledger_counts");
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let shapes: [(&[usize], DType); 4] = [
        (&[3, 5], DType::F32),
        (&[17], DType::BF16),
        (&[2, 2, 9], DType::I64),
        (&[1], DType::U8),
    ];
    let mut keep_cpu = Vec::new();
    let mut keep_gpu = Vec::new();
    for (shape, dtype) in shapes {
        keep_cpu.push(Tensor::zeros(shape, dtype, Device::Cpu).unwrap());
        let n = shape.iter().product();
        keep_gpu.push(CudaBuffer::alloc_in(&dev, dtype, n, Category::Activation).unwrap());
    }
    let cuda = Device::Cuda(0);
    assert_eq!(ledger.live(cuda), ledger.live(Device::Cpu));
    assert_eq!(ledger.allocation_count(cuda), 4);
    keep_gpu[0].allocation().unwrap().mark_saved("test/op");
    assert_eq!(ledger.live_in(cuda, Category::Saved), 15 * 4);
    drop(keep_gpu);
    assert_eq!(ledger.live(cuda), 0);
    assert_eq!(ledger.peak(cuda), ledger.peak(Device::Cpu));
}

#[test]
fn allocation_past_a_ledger_limit_is_the_typed_oom_error() {
    let dev = cuda_or_skip!("oom");
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let cuda = Device::Cuda(0);
    ledger.set_limit(cuda, Some(4096));
    let _a = CudaBuffer::alloc(&dev, DType::F32, 512).unwrap();
    match CudaBuffer::alloc(&dev, DType::F32, 1000) {
        Err(Error::OutOfMemory {
            device,
            requested,
            live,
            summary,
        }) => {
            assert_eq!((device, requested, live), (cuda, 4000, 2048));
            assert!(summary.contains("cuda:0"), "{summary}");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert_eq!(ledger.live(cuda), 2048);
    // The device itself refusing is the same typed error (1 PiB).
    ledger.set_limit(cuda, None);
    let huge = CudaBuffer::alloc(&dev, DType::U8, 1 << 50);
    assert!(matches!(huge, Err(Error::OutOfMemory { .. })), "{huge:?}");
    assert_eq!(ledger.live(cuda), 2048);
}

#[test]
fn driver_memory_view_is_a_coarse_cross_check() {
    let dev = cuda_or_skip!("mem_get_info");
    let (free0, total) = dev.mem_get_info().unwrap();
    assert!(free0 <= total && total > 0);
    let big = CudaBuffer::zeros(&dev, DType::U8, 256 << 20).unwrap();
    dev.synchronize().unwrap();
    let (free1, _) = dev.mem_get_info().unwrap();
    println!(
        "driver: total {total} B, free {free0} → {free1} B after a 256 MiB buffer (ledger: {} B)",
        Ledger::current().live(Device::Cuda(0))
    );
    // Other tests allocate and free concurrently, so only bounds hold exactly.
    assert!(free1 <= total);
    assert_eq!(big.size_in_bytes(), 256 << 20);
    drop(big);
}

#[test]
fn pool_high_water_mark_covers_the_ledger_peak() {
    let dev = cuda_or_skip!("pool_usage");
    let Some(before) = dev.pool_usage().unwrap() else {
        println!("device allocates without a memory pool: no high-water mark to compare");
        return;
    };
    assert!(before.used <= before.reserved && before.used_high >= before.used);
    let ledger = Ledger::new();
    let _guard = ledger.enter();
    dev.synchronize().unwrap();
    dev.reset_pool_high_water().unwrap();
    let base = dev.pool_usage().unwrap().unwrap().used;
    let a = CudaBuffer::zeros(&dev, DType::F32, 8 << 20).unwrap();
    let b = CudaBuffer::zeros(&dev, DType::F32, 4 << 20).unwrap();
    drop(a);
    let c = CudaBuffer::zeros(&dev, DType::F32, 2 << 20).unwrap();
    dev.synchronize().unwrap();
    let after = dev.pool_usage().unwrap().unwrap();
    let peak = ledger.peak(Device::Cuda(0)) as u64;
    assert_eq!(
        peak,
        (12 << 20) * 4,
        "the ledger's peak: a and b live together"
    );
    println!(
        "pool: used {} → {} B, high-water {} B over a base of {base} B; ledger peak {peak} B",
        before.used, after.used, after.used_high
    );
    // Tests in parallel threads allocate and free from the same pool, so
    // the pool's mark bounds the ledger's peak from above rather than
    // equalling it (a and b were in the pool together).
    assert!(after.used_high >= peak, "{after:?} vs ledger peak {peak}");
    drop((b, c));
}

#[test]
fn the_pool_keeps_freed_memory_across_a_synchronize() {
    let dev = cuda_or_skip!("pool_release_threshold");
    let Some(threshold) = dev.pool_release_threshold().unwrap() else {
        println!("device allocates without a memory pool: nothing is kept");
        return;
    };
    assert_eq!(threshold, u64::MAX, "set when the device is opened");
    let buffer = CudaBuffer::zeros(&dev, DType::U8, 64 << 20).unwrap();
    dev.synchronize().unwrap();
    let held = dev.pool_usage().unwrap().unwrap().reserved;
    drop(buffer);
    dev.synchronize().unwrap();
    // With the driver's default threshold (0) the synchronize would give
    // the freed 64 MiB back; other tests only allocate and free in the
    // same pool, which never shrinks now.
    let after = dev.pool_usage().unwrap().unwrap();
    assert!(
        after.reserved >= held,
        "{held} B reserved before the free: {after:?}"
    );
}
