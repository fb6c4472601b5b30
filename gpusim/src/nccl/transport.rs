//! Sockets between the processes of a communicator: unique ids that name
//! a listening socket, the listener, and the threads that carry frames.
//!
//! `ncclGetUniqueId` opens (once per process) a TCP listener on
//! 127.0.0.1, port chosen by the system, served by a thread. A unique id
//! holds: bytes 0..8 the magic `gpusimNC`, 8..12 the creating process's id,
//! 12..20 a serial number (per process, from 1), 20..24 the listener's IPv4
//! address and 24..26 its port (both 0 when no listener could be opened),
//! all little-endian except the address; the rest is zero.
//!
//! A process that joins with an id made elsewhere connects to that address
//! (one connection per id and process) and says `Hello`; the creating
//! process is the communicator's hub (`net`, `join`). Each connection has a
//! reader thread, which handles every frame under the simulator's lock,
//! and a writer thread fed by a channel: code holding the lock never
//! blocks on a socket (two processes each holding its lock while writing
//! to the other could otherwise stall both).

use super::join;
use super::state::Failure;
use super::wire::{decode, encode, read_frame, Msg};
use super::*;
use crate::driver::lock::notify;
use crate::driver::state::Sim;
use std::io::{BufReader, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The first bytes of every gpusim unique id.
const MAGIC: &[u8; 8] = b"gpusimNC";

/// Serial numbers of this process's unique ids (the last one made).
static SERIAL: AtomicU64 = AtomicU64::new(0);

/// A parsed unique id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Id {
    /// The creating process.
    pub pid: u32,
    /// Its serial number there.
    pub serial: u64,
    /// The creating process's listener, if it has one.
    pub addr: Option<SocketAddrV4>,
}

/// This process's listener's address, once opened (`None` inside: it
/// could not be).
static LISTENER: OnceLock<Option<SocketAddrV4>> = OnceLock::new();

/// This process's listener, if one was opened (none is opened here).
pub fn own_listener() -> Option<SocketAddrV4> {
    LISTENER.get().copied().flatten()
}

/// This process's listener: opened (and its thread started) on first use;
/// `None` if it could not be.
pub fn listener() -> Option<SocketAddrV4> {
    *LISTENER.get_or_init(|| {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).ok()?;
        let SocketAddr::V4(addr) = l.local_addr().ok()? else {
            return None;
        };
        std::thread::Builder::new()
            .name("gpusim-nccl-listen".into())
            .spawn(move || accept(l))
            .ok()?;
        Some(addr)
    })
}

/// A fresh unique id (see the module doc).
pub fn make_id() -> NcclUniqueId {
    let serial = SERIAL.fetch_add(1, Relaxed) + 1;
    let mut b = [0u8; 128];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    b[12..20].copy_from_slice(&serial.to_le_bytes());
    if let Some(a) = listener() {
        b[20..24].copy_from_slice(&a.ip().octets());
        b[24..26].copy_from_slice(&a.port().to_le_bytes());
    }
    NcclUniqueId {
        internal: b.map(|x| x as c_char),
    }
}

/// The fields of unique id `id`, or why it is not a gpusim one.
pub fn parse_id(id: &NcclUniqueId) -> NResult<Id> {
    let b = id.internal.map(|x| x as u8);
    if &b[..8] != MAGIC {
        return nfail(
            NCCL_INVALID_ARGUMENT,
            "the unique id was not made by ncclGetUniqueId of gpusim",
        );
    }
    let pid = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    let mut s = [0u8; 8];
    s.copy_from_slice(&b[12..20]);
    let port = u16::from_le_bytes([b[24], b[25]]);
    let ip = Ipv4Addr::new(b[20], b[21], b[22], b[23]);
    Ok(Id {
        pid,
        serial: u64::from_le_bytes(s),
        addr: (port != 0).then(|| SocketAddrV4::new(ip, port)),
    })
}

/// Why the `Hello` of a process joining id (`creator`, `serial`) is
/// refused here, if it is: this process did not make that id.
pub fn refuse_hello(creator: u32, serial: u64) -> Option<Failure> {
    let me = std::process::id();
    if creator == me && serial >= 1 && serial <= SERIAL.load(Relaxed) {
        return None;
    }
    Some(Failure::new(
        NCCL_INVALID_USAGE,
        format!("the unique id names process {creator} (serial {serial}), but process {me} listens at its address and made no such id: the id was altered or is stale, so no transport between processes can be set up from it"),
    ))
}

/// Set by a writer thread once everything sent through its channel is
/// written (or the socket failed).
#[derive(Debug, Default)]
pub struct Flushed(Mutex<bool>, Condvar);

impl Flushed {
    /// Waits up to `limit` for the writer to finish.
    pub fn wait(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut done = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            done = match self.1.wait_timeout(done, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

/// The sending end of a connection.
#[derive(Debug)]
pub struct Out {
    /// Frames to write.
    pub tx: Sender<Vec<u8>>,
    /// Set when the writer is done.
    pub flushed: Arc<Flushed>,
}

impl Out {
    /// Queues `m` (dropped if the connection is gone).
    pub fn send(&self, m: &Msg) {
        let _ = self.tx.send(encode(m));
    }
}

/// Starts the writer thread of `s`; when every sender is dropped it
/// finishes writing and closes its half of the connection.
fn writer(mut s: TcpStream) -> std::io::Result<Out> {
    let (tx, rx) = channel::<Vec<u8>>();
    let flushed = Arc::new(Flushed::default());
    let f = flushed.clone();
    std::thread::Builder::new()
        .name("gpusim-nccl-send".into())
        .spawn(move || {
            for frame in rx {
                if s.write_all(&frame).is_err() {
                    break;
                }
            }
            let _ = s.shutdown(Shutdown::Write);
            *f.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
            f.1.notify_all();
        })?;
    Ok(Out { tx, flushed })
}

/// A fresh connection number.
fn next_chan() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Relaxed) + 1
}

/// `GPUSIM_NCCL_TIMEOUT_MS` as the environment says now (for a listener
/// that may serve before `cuInit` read it).
fn env_timeout() -> Duration {
    let ms = std::env::var("GPUSIM_NCCL_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&v| v > 0)
        .unwrap_or(30_000);
    Duration::from_millis(ms)
}

/// Runs `f` on the simulator under its lock, waiting (up to the NCCL
/// timeout) for `cuInit` if it has not run yet; wakes the waiters after.
/// `None` if the simulator never came or `f` panicked.
pub fn with_sim<R>(f: impl FnOnce(&mut Sim) -> R) -> Option<R> {
    let deadline = Instant::now() + env_timeout();
    loop {
        let mut g = crate::driver::state::lock();
        if let Some(sim) = g.as_mut() {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(sim)));
            notify();
            return r.ok();
        }
        drop(g);
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The listener's loop: one serving thread per connection.
fn accept(l: TcpListener) {
    for s in l.incoming() {
        match s {
            Ok(s) => {
                let _ = std::thread::Builder::new()
                    .name("gpusim-nccl-hub".into())
                    .spawn(move || serve(s));
            }
            // Out of descriptors or the like: do not spin.
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Serves one connection to this process's listener: its `Hello`, then
/// its frames, until it ends.
fn serve(s: TcpStream) {
    let _ = s.set_nodelay(true);
    let Ok(w) = s.try_clone() else {
        return;
    };
    let Ok(out) = writer(w) else {
        return;
    };
    let mut r = BufReader::new(s);
    // A client that connects and says nothing is not waited for forever.
    let _ = r.get_ref().set_read_timeout(Some(env_timeout() * 2));
    let hello = read_frame(&mut r).map(|f| f.map(|b| decode(&b)));
    let _ = r.get_ref().set_read_timeout(None);
    let Ok(Some(Ok(Msg::Hello {
        serial,
        creator,
        pid,
    }))) = hello
    else {
        return;
    };
    if let Some(f) = refuse_hello(creator, serial) {
        out.send(&Msg::JoinFailed(f));
        let flushed = out.flushed.clone();
        drop(out);
        flushed.wait(Duration::from_secs(2));
        // Read until the joiner hangs up: closing with its frames unread
        // would reset the connection and could lose the refusal.
        let _ = r.get_ref().set_read_timeout(Some(Duration::from_secs(2)));
        while let Ok(Some(_)) = read_frame(&mut r) {}
        return;
    }
    let chan = next_chan();
    let info = join::ChanInfo {
        out,
        pid,
        creator,
        serial,
        clique: None,
        hub: true,
    };
    if with_sim(|sim| join::open(sim, chan, info)).is_none() {
        return; // dropping the connection tells the joiner
    }
    read_loop(chan, r);
}

/// Reads and handles frames of connection `chan` until it ends, then
/// tells its side of the communicator.
fn read_loop(chan: u64, mut r: BufReader<TcpStream>) {
    let why = loop {
        let m = match read_frame(&mut r) {
            Ok(Some(b)) => match decode(&b) {
                Ok(m) => m,
                Err(e) => break format!("a malformed message: {e}"),
            },
            Ok(None) => break "the connection was closed".to_string(),
            Err(e) => break format!("the connection failed: {e}"),
        };
        match with_sim(|sim| join::handle(sim, chan, m)) {
            Some(Ok(())) => {}
            Some(Err(e)) => break format!("a malformed message: {e}"),
            None => break "internal error handling a message".to_string(),
        }
    };
    let _ = r.get_ref().shutdown(Shutdown::Both);
    with_sim(|sim| join::lost(sim, chan, &why));
}

/// Connects to the creator of unique id `id` (at `addr`), says `Hello`
/// and starts the connection's reader; returns its number and sending end.
pub fn connect(id: &Id, addr: SocketAddrV4) -> std::io::Result<(u64, Out)> {
    let s = TcpStream::connect_timeout(&SocketAddr::V4(addr), Duration::from_secs(5))?;
    let _ = s.set_nodelay(true);
    let out = writer(s.try_clone()?)?;
    out.send(&Msg::Hello {
        serial: id.serial,
        creator: id.pid,
        pid: std::process::id(),
    });
    let chan = next_chan();
    let r = BufReader::new(s);
    std::thread::Builder::new()
        .name("gpusim-nccl-recv".into())
        .spawn(move || read_loop(chan, r))?;
    Ok((chan, out))
}
