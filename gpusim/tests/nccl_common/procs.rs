//! Child processes for the NCCL tests across processes: the test binary
//! runs itself again (`--exact child`) with the child's role, the unique
//! id and the machine's shape in the environment; parent and child talk in
//! lines (`@@ …`) over the child's stdin and stdout; every wait is bounded.
#![allow(dead_code)]

use super::nccl_common::NcclUniqueId;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The variable naming a child's role (unset in the parent).
const ROLE: &str = "GPUSIM_NCCL_TEST_ROLE";
/// The variable holding the unique id (hex).
const ID: &str = "GPUSIM_NCCL_TEST_ID";
/// The prefix of protocol lines (the test harness prints its own).
const TAG: &str = "@@ ";

/// The longest a child may take to finish.
pub const CHILD_LIMIT: Duration = Duration::from_secs(60);

/// `id` as hex.
pub fn hex(id: &NcclUniqueId) -> String {
    id.internal
        .iter()
        .map(|&b| format!("{:02x}", b as u8))
        .collect()
}

/// The id of hex `s`.
pub fn unhex(s: &str) -> NcclUniqueId {
    let mut id = NcclUniqueId { internal: [0; 128] };
    for (i, d) in id.internal.iter_mut().enumerate() {
        *d = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex") as _;
    }
    id
}

/// In a child (its role set): runs `f(role, id)` and exits the process,
/// 0 if it returned, 101 if it panicked. In the parent: returns at once.
pub fn child_main(f: impl FnOnce(&str, NcclUniqueId)) {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let id = unhex(&std::env::var(ID).expect("the id"));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&role, id)));
    let _ = std::io::stdout().flush();
    std::process::exit(if r.is_ok() { 0 } else { 101 });
}

/// A child says `what` to its parent.
pub fn say(what: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{TAG}{what}");
    let _ = out.flush();
}

/// A child waits for its parent's next line.
pub fn hear() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("stdin");
    line.trim().to_string()
}

/// A running child process.
pub struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    role: String,
}

/// Starts a child in role `role` with unique id `id`, 2 devices and NCCL
/// timeout `timeout_ms`.
pub fn spawn(role: &str, id: &NcclUniqueId, timeout_ms: u64) -> Proc {
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(ID, hex(id))
        .env("GPUSIM_DEVICE_COUNT", "2")
        .env("GPUSIM_NCCL_TIMEOUT_MS", timeout_ms.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let (tx, lines) = channel();
    let out = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            // The harness may have begun the line ("test child ... ").
            if let Some(at) = line.find(TAG) {
                let _ = tx.send(line[at + TAG.len()..].to_string());
            }
        }
    });
    let stderr = Arc::new(Mutex::new(String::new()));
    let (err, sink) = (child.stderr.take().expect("stderr"), stderr.clone());
    std::thread::spawn(move || {
        let mut r = BufReader::new(err);
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    Proc {
        stdin: child.stdin.take(),
        child,
        lines,
        stderr,
        role: role.to_string(),
    }
}

impl Proc {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the child printed to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (up to `CHILD_LIMIT`) for the child's next line, which must be
    /// `want`.
    pub fn expect(&mut self, want: &str) {
        self.line_where(want, |l| l == want);
    }

    /// Waits (up to `CHILD_LIMIT`) for the child's next line and returns
    /// it; it must satisfy `ok` (`what` describes it).
    pub fn line_where(&mut self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        match self.lines.recv_timeout(CHILD_LIMIT) {
            Ok(l) if ok(&l) => l,
            other => {
                // Let the child's last words arrive.
                std::thread::sleep(Duration::from_millis(300));
                let status = self.child.try_wait();
                let _ = self.child.kill();
                panic!(
                    "child {} said {other:?}, not {what:?} (exit: {status:?}); its stderr:\n{}",
                    self.role,
                    self.stderr()
                );
            }
        }
    }

    /// Kills the child and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Tells the child `what`.
    pub fn tell(&mut self, what: &str) {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{what}").expect("tell the child");
        stdin.flush().expect("tell the child");
    }

    /// Waits (up to `CHILD_LIMIT`) for the child to exit; panics unless it
    /// succeeded.
    pub fn finish(mut self) {
        let deadline = Instant::now() + CHILD_LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "child {} did not finish in {CHILD_LIMIT:?}; its stderr:\n{}",
                    self.role,
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // Let the reader drain what the child wrote last.
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            status.success(),
            "child {} failed ({status}); its stderr:\n{}",
            self.role,
            self.stderr()
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A failed test must not leave its children behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
