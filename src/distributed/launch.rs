//! Starting one process per rank on this machine, as `torchrun` does: each
//! child gets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `GROUP_RANK`, `MASTER_ADDR` and `MASTER_PORT`; the launcher waits for
//! all, and when one fails it stops the others and reports which.

use crate::{Error, Result};
use std::process::{Child, Command};
use std::time::Duration;

/// How many processes to start here and where this machine sits among the
/// machines of the job.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Processes (ranks) on this machine: one per GPU.
    pub nproc_per_node: usize,
    /// Machines in the job.
    pub nnodes: usize,
    /// This machine's index, `0..nnodes` (rank 0 runs on machine 0).
    pub node_rank: usize,
    /// Machine 0's address, where rank 0 listens.
    pub master_addr: String,
    /// Rank 0's rendezvous port.
    pub master_port: u16,
}

impl LaunchOptions {
    /// `nproc_per_node` processes on one machine, rank 0 at
    /// `127.0.0.1:29500`.
    pub fn new(nproc_per_node: usize) -> LaunchOptions {
        LaunchOptions {
            nproc_per_node,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
        }
    }

    /// The environment of the process of local rank `local`.
    pub fn environment(&self, local: usize) -> Vec<(&'static str, String)> {
        let rank = self.node_rank * self.nproc_per_node + local;
        vec![
            ("RANK", rank.to_string()),
            (
                "WORLD_SIZE",
                (self.nnodes * self.nproc_per_node).to_string(),
            ),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
        ]
    }

    fn check(&self) -> Result<()> {
        let bad = |msg: String| Error::InvalidArgument { op: "launch", msg };
        if self.nproc_per_node == 0 || self.nnodes == 0 {
            return Err(bad(
                "--nproc-per-node and --nnodes must be at least 1".into()
            ));
        }
        if self.node_rank >= self.nnodes {
            return Err(bad(format!(
                "--node-rank {} is not below --nnodes {}",
                self.node_rank, self.nnodes
            )));
        }
        Ok(())
    }
}

/// How the launched processes ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// 0 when every process succeeded; else the first failure's exit code
    /// (1 for a process ended by a signal).
    pub code: i32,
    /// The global rank that failed first, if one did.
    pub failed_rank: Option<usize>,
}

/// Starts `program args…` once per local rank with the environment of
/// [`LaunchOptions::environment`] (stdout and stderr inherited), waits for
/// all of them, and stops the others as soon as one fails.
pub fn launch(opts: &LaunchOptions, program: &str, args: &[String]) -> Result<LaunchOutcome> {
    opts.check()?;
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(opts.nproc_per_node);
    for local in 0..opts.nproc_per_node {
        let rank = opts.node_rank * opts.nproc_per_node + local;
        let mut command = Command::new(program);
        command.args(args).envs(opts.environment(local));
        group::own_group(&mut command);
        let spawned = command.spawn();
        match spawned {
            Ok(child) => children.push((rank, child)),
            Err(e) => {
                stop_all(&mut children);
                return Err(Error::InvalidArgument {
                    op: "launch",
                    msg: format!("cannot start {program:?} for rank {rank}: {e}"),
                });
            }
        }
    }
    group::forward_interrupts();
    wait_all(children)
}

/// Polls the children until all have ended or one has failed (then stops
/// the rest).
fn wait_all(mut running: Vec<(usize, Child)>) -> Result<LaunchOutcome> {
    while !running.is_empty() {
        if group::interrupted() {
            stop_all(&mut running);
            return Ok(LaunchOutcome {
                code: 130,
                failed_rank: None,
            });
        }
        let mut i = 0;
        while i < running.len() {
            match running[i].1.try_wait()? {
                None => i += 1,
                Some(status) if status.success() => {
                    running.swap_remove(i);
                }
                Some(status) => {
                    let rank = running.swap_remove(i).0;
                    stop_all(&mut running);
                    return Ok(LaunchOutcome {
                        code: status.code().unwrap_or(1),
                        failed_rank: Some(rank),
                    });
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(LaunchOutcome {
        code: 0,
        failed_rank: None,
    })
}

/// Ends every still-running child, with whatever it started: a polite
/// signal first, then a kill for those still there after a grace period.
fn stop_all(children: &mut Vec<(usize, Child)>) {
    for (_, c) in children.iter_mut() {
        group::terminate(c);
    }
    let deadline = std::time::Instant::now() + STOP_GRACE;
    for (_, mut c) in children.drain(..) {
        while matches!(c.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        group::kill(&mut c);
        let _ = c.wait();
    }
}

/// How long a stopped rank may take to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Process groups on Unix: each rank leads its own, so that stopping it
/// stops what it started too; the launcher passes Ctrl-C (and SIGTERM) on,
/// since a rank in its own group no longer gets the terminal's.
#[cfg(unix)]
mod group {
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};
    use std::sync::atomic::{AtomicBool, Ordering};

    static INTERRUPTED: AtomicBool = AtomicBool::new(false);

    extern "C" fn on_signal(_: libc::c_int) {
        INTERRUPTED.store(true, Ordering::SeqCst);
    }

    pub(super) fn own_group(c: &mut Command) {
        c.process_group(0);
    }

    pub(super) fn forward_interrupts() {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
    }

    pub(super) fn interrupted() -> bool {
        INTERRUPTED.load(Ordering::SeqCst)
    }

    fn signal_group(c: &Child, signal: libc::c_int) {
        if let Ok(pid) = libc::pid_t::try_from(c.id()) {
            // SAFETY: signals the group the child leads (its pid).
            unsafe { libc::kill(-pid, signal) };
        }
    }

    pub(super) fn terminate(c: &mut Child) {
        signal_group(c, libc::SIGTERM);
    }

    pub(super) fn kill(c: &mut Child) {
        signal_group(c, libc::SIGKILL);
    }
}

/// Elsewhere: the children themselves, no groups.
#[cfg(not(unix))]
mod group {
    use std::process::{Child, Command};
    pub(super) fn own_group(_: &mut Command) {}
    pub(super) fn forward_interrupts() {}
    pub(super) fn interrupted() -> bool {
        false
    }
    pub(super) fn terminate(c: &mut Child) {
        let _ = c.kill();
    }
    pub(super) fn kill(c: &mut Child) {
        let _ = c.kill();
    }
}
