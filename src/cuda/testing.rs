//! For unit tests of launch code inside the crate: CUDA device 0, or a
//! printed skip — a failure under `LEANGRAD_REQUIRE_CUDA=1`, as the
//! integration suites' `cuda_common::device`.

use super::CudaDevice;
use std::io::Write;
use std::sync::Arc;

/// CUDA device 0, or `None` after printing `skipped: no CUDA device
/// (reason) [test]`; panics with the reason under `LEANGRAD_REQUIRE_CUDA=1`.
pub(crate) fn device(test: &str) -> Option<Arc<CudaDevice>> {
    match CudaDevice::get(0) {
        Ok(d) => Some(d),
        Err(e) => {
            let required = std::env::var("LEANGRAD_REQUIRE_CUDA").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "LEANGRAD_REQUIRE_CUDA=1 but no CUDA device: {e} [{test}]"
            );
            // Past libtest's capture, so every skip shows in the log.
            let _ = writeln!(std::io::stderr(), "skipped: no CUDA device ({e}) [{test}]");
            None
        }
    }
}
