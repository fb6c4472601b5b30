//! Ranks as threads on simulated CUDA devices, shared by the
//! `tests/cuda_distributed.rs` and `tests/cuda_ddp.rs` suites: four
//! simulated devices and a short NCCL timeout (set before the first CUDA
//! call; no effect on a real GPU), a check that enough devices are open
//! (a printed skip, or a failure under `LEANGRAD_REQUIRE_CUDA=1`), and a
//! group of ranks run one group at a time.
#![allow(dead_code)]

use super::cuda_common;
use leangrad::distributed::{InitOptions, ProcessGroup};
use leangrad::Device;
use std::net::TcpListener;
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

/// Four simulated devices and a short NCCL timeout, before any CUDA call
/// (no effect on a real GPU).
pub fn simulator_settings() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("GPUSIM_DEVICE_COUNT").is_none() {
            std::env::set_var("GPUSIM_DEVICE_COUNT", "4");
        }
        if std::env::var_os("GPUSIM_NCCL_TIMEOUT_MS").is_none() {
            std::env::set_var("GPUSIM_NCCL_TIMEOUT_MS", "3000");
        }
    });
}

/// Whether `world` CUDA devices are open (else a printed skip, or a
/// failure under `LEANGRAD_REQUIRE_CUDA=1`).
pub fn have_devices(test: &str, world: usize) -> bool {
    simulator_settings();
    if cuda_common::device(test).is_none() {
        return false;
    }
    let open = (0..world)
        .filter(|&i| Device::Cuda(i).check_available().is_ok())
        .count();
    if open < world {
        assert!(
            !cuda_common::cuda_required(),
            "LEANGRAD_REQUIRE_CUDA=1 but {open} of {world} CUDA devices open [{test}]"
        );
        eprintln!("skipped: {open} CUDA device(s), {world} needed [{test}]");
        return false;
    }
    true
}

/// [`have_devices`] for tests that train models: a simulated device
/// simulates its kernels on a CPU core, and several ranks' steps on a
/// 2-core machine take seconds between one rank's collective and another's,
/// so the NCCL timeout is 120 s here (unless set).
pub fn have_devices_for_training(test: &str, world: usize) -> bool {
    if std::env::var_os("GPUSIM_NCCL_TIMEOUT_MS").is_none() {
        std::env::set_var("GPUSIM_NCCL_TIMEOUT_MS", "120000");
    }
    have_devices(test, world)
}

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// One group at a time: two tests' groups on the same devices would
/// interleave their collectives in the devices' queues (and a test reading
/// the simulator's profile wants only its own work in it).
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static ONE_GROUP: Mutex<()> = Mutex::new(());
    ONE_GROUP.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f(group)` on ranks `0..world` (threads), each on its own device.
pub fn on_ranks<T: Send + 'static>(
    world: usize,
    f: impl Fn(&ProcessGroup) -> T + Send + Sync + 'static,
) -> Vec<T> {
    on_ranks_shared(world, move |g: Arc<ProcessGroup>| f(&g))
}

/// [`on_ranks`] handing each rank its group to keep.
pub fn on_ranks_shared<T: Send + 'static>(
    world: usize,
    f: impl Fn(Arc<ProcessGroup>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let _one = one_at_a_time();
    let port = free_port();
    let f = Arc::new(f);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let f = f.clone();
            std::thread::spawn(move || {
                let group = InitOptions::new(rank, world)
                    .master("127.0.0.1", port)
                    .timeout(Duration::from_secs(30))
                    .init()
                    .unwrap();
                f(Arc::new(group))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}
