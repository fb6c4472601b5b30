//! A failing device `assert`: the call of `__assertfail` ends the launch
//! with a [`FaultKind::Assert`] fault that quotes the assertion as the
//! CUDA runtime prints it (file, line, function, message), its strings
//! read from device memory where the call's arguments point.

use super::exec::{Exec, Warp};
use super::{Fault, FaultKind};

/// Longest string read for a message (a runaway pointer stops here).
const MAX_STRING: usize = 4096;

impl Exec<'_> {
    /// Little-endian argument bytes of lane `l` at frame offset `off`.
    fn frame_arg(w: &Warp, l: usize, off: u32, size: usize) -> u64 {
        let base = w.frame_base as usize + off as usize;
        (0..size).fold(0u64, |v, k| {
            v | (w.local.get((base + k) * 32 + l).copied().unwrap_or(0) as u64) << (8 * k)
        })
    }

    /// The NUL-terminated string at device address `a`, or why not.
    fn device_string(&self, a: u64) -> String {
        let Ok(alloc) = self.mem.find(a, 1) else {
            return format!("<unreadable string at {a:#x}>");
        };
        let off = (a - alloc.base) as usize;
        let bytes = &alloc.data[off..];
        let end = bytes
            .iter()
            .take(MAX_STRING)
            .position(|&b| b == 0)
            .unwrap_or(bytes.len().min(MAX_STRING));
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// The fault of `__assertfail(message, file, line, function, charSize)`
    /// called by the lanes of `m`: reported for the first of them.
    pub(crate) fn assert_fail(&self, w: &Warp, args: [u32; 5], m: u32, pc: u32) -> Fault {
        let l = m.trailing_zeros() as usize;
        let msg = self.device_string(Self::frame_arg(w, l, args[0], 8));
        let file = self.device_string(Self::frame_arg(w, l, args[1], 8));
        let line = Self::frame_arg(w, l, args[2], 4);
        let func = self.device_string(Self::frame_arg(w, l, args[3], 8));
        let t = super::exec::thread_of(&self.dims, w.id, l as u32);
        let others = m.count_ones() - 1;
        let also = if others > 0 {
            format!(" ({others} more lanes of this warp failed it too)")
        } else {
            String::new()
        };
        let detail = format!(
            "device-side assertion failed: {file}:{line}: {func}: block: [{},{},{}], thread: \
             [{},{},{}] Assertion `{msg}` failed.{also}",
            self.block[0], self.block[1], self.block[2], t[0], t[1], t[2]
        );
        self.fault(FaultKind::Assert, w.id, l as u32, pc, None, detail)
    }
}
