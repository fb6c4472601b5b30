//! The TCP rendezvous: rank 0 listens on the master address and port, every
//! other rank connects and says who it is, and once all have arrived rank 0
//! hands each the same payload (the NCCL unique id). Plain std networking;
//! every wait has the group's timeout.
//!
//! Wire format (all integers little-endian): a rank sends `LGRV`, the
//! protocol version (u32), its world size (u32) and its rank (u32); rank 0
//! answers a status byte (0: go on, 1: refused) and a length-prefixed (u32)
//! body: the payload, or the reason it refused.

use crate::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"LGRV";
const VERSION: u32 = 1;
/// The most bytes a body may announce (a unique id is 128; a reason a line).
const MAX_BODY: usize = 1 << 16;
/// How much longer than its timeout a rank that reached rank 0 waits for
/// the answer (rank 0's deadline started when it did, not when this did).
const ANSWER_GRACE: Duration = Duration::from_secs(2);
/// How often a rank retries reaching rank 0, which may not be up yet.
const RETRY: Duration = Duration::from_millis(20);

/// Where rank 0 listens, and how long every rank waits for the others.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    /// This process's rank.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// Rank 0's host name or address.
    pub master_addr: String,
    /// Rank 0's port.
    pub master_port: u16,
    /// How long a rank waits for the others (rank 0: for all to arrive;
    /// the others: to reach rank 0 and for its answer).
    pub timeout: Duration,
}

impl Rendezvous {
    fn error(&self, msg: String) -> Error {
        Error::Distributed {
            rank: self.rank,
            msg,
        }
    }

    fn endpoint(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }

    /// Runs the rendezvous: rank 0 gives `payload` (which the others must
    /// pass as `None`) and every rank gets it back once all `world_size`
    /// ranks have arrived.
    pub fn exchange(&self, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        if self.rank >= self.world_size {
            return Err(self.error(format!(
                "rank {} is not below the world size {}",
                self.rank, self.world_size
            )));
        }
        match (self.rank, payload) {
            (0, Some(p)) if self.world_size == 1 => Ok(p.to_vec()),
            (0, Some(p)) => self.serve(p),
            (0, None) => Err(self.error("rank 0 must give the payload".into())),
            (_, _) => self.join(),
        }
    }

    /// Rank 0: accepts every other rank, checks what each says, and sends
    /// the payload to all (or the reason to refuse to all that came).
    fn serve(&self, payload: &[u8]) -> Result<Vec<u8>> {
        let addr = self.resolve()?;
        let listener = TcpListener::bind(addr).map_err(|e| {
            let why = if e.kind() == ErrorKind::AddrInUse {
                "the port is in use (another group, or another program: choose another MASTER_PORT)"
                    .to_string()
            } else {
                e.to_string()
            };
            self.error(format!("cannot listen on {}: {why}", self.endpoint()))
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| self.error(format!("listener: {e}")))?;
        let deadline = Instant::now() + self.timeout;
        let mut joined: Vec<(usize, TcpStream)> = Vec::new();
        while joined.len() + 1 < self.world_size {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Some(arrival) = self.greet(stream, deadline, &mut joined)? {
                        joined.push(arrival);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing = missing_ranks(self.world_size, &joined);
                        let msg = format!(
                            "rank(s) {missing:?} did not arrive at {} within {:.1} s",
                            self.endpoint(),
                            self.timeout.as_secs_f64()
                        );
                        refuse_all(&mut joined, &msg);
                        return Err(self.error(msg));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(self.error(format!("accept: {e}"))),
            }
        }
        for (rank, stream) in &mut joined {
            send_reply(stream, 0, payload)
                .map_err(|e| self.error(format!("sending to rank {rank}: {e}")))?;
        }
        Ok(payload.to_vec())
    }

    /// Reads one arriving rank's hello: `Some` when it is a new rank of this
    /// group, `None` for a connection that said nothing understandable (it
    /// is dropped); an error (sent to every rank that came) when it
    /// disagrees on the world size or repeats a rank.
    fn greet(
        &self,
        mut stream: TcpStream,
        deadline: Instant,
        joined: &mut [(usize, TcpStream)],
    ) -> Result<Option<(usize, TcpStream)>> {
        let left = deadline.saturating_duration_since(Instant::now());
        let setup = stream
            .set_nonblocking(false)
            .and_then(|_| stream.set_read_timeout(Some(left.max(Duration::from_millis(1)))));
        if setup.is_err() {
            return Ok(None);
        }
        let mut hello = [0u8; 16];
        if stream.read_exact(&mut hello).is_err() || &hello[..4] != MAGIC {
            return Ok(None);
        }
        let word =
            |i: usize| u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]);
        let (version, world, rank) = (word(4), word(8) as usize, word(12) as usize);
        let problem = if version != VERSION {
            Some(format!(
                "a rank speaks rendezvous version {version}, rank 0 version {VERSION}"
            ))
        } else if world != self.world_size {
            Some(format!(
                "rank {rank} was started with world size {world}, rank 0 with {}",
                self.world_size
            ))
        } else if rank == 0 || rank >= world {
            Some(format!(
                "a process says it is rank {rank} of {world}: ranks are 1..{} besides rank 0",
                world.saturating_sub(1)
            ))
        } else if joined.iter().any(|(r, _)| *r == rank) {
            Some(format!("two processes say they are rank {rank}"))
        } else {
            None
        };
        match problem {
            None => Ok(Some((rank, stream))),
            Some(msg) => {
                let _ = send_reply(&mut stream, 1, msg.as_bytes());
                refuse_all(joined, &msg);
                Err(self.error(msg))
            }
        }
    }

    /// A rank other than 0: reaches rank 0 (retrying until the timeout,
    /// since rank 0 may start later), says who it is, and waits for the
    /// payload.
    fn join(&self) -> Result<Vec<u8>> {
        let deadline = Instant::now() + self.timeout;
        let addr = self.resolve()?;
        let mut stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
                Ok(s) => break s,
                Err(_) if Instant::now() + RETRY < deadline => std::thread::sleep(RETRY),
                Err(e) => {
                    return Err(self.error(format!(
                        "could not reach rank 0 at {} within {:.1} s ({e})",
                        self.endpoint(),
                        self.timeout.as_secs_f64()
                    )))
                }
            }
        };
        let mut hello = Vec::with_capacity(16);
        hello.extend_from_slice(MAGIC);
        for v in [VERSION, self.world_size as u32, self.rank as u32] {
            hello.extend_from_slice(&v.to_le_bytes());
        }
        stream
            .write_all(&hello)
            .map_err(|e| self.error(format!("sending to rank 0: {e}")))?;
        // Rank 0 answers by its own deadline (the payload, or why it gives
        // up), which may fall a little after this rank's: wait that long.
        let left = deadline.saturating_duration_since(Instant::now()) + ANSWER_GRACE;
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| self.error(e.to_string()))?;
        let (status, body) = read_reply(&mut stream).map_err(|e| {
            self.error(format!(
                "rank 0 at {} did not answer within {:.1} s ({e})",
                self.endpoint(),
                self.timeout.as_secs_f64()
            ))
        })?;
        match status {
            0 => Ok(body),
            _ => Err(self.error(format!(
                "rank 0 refused the group: {}",
                String::from_utf8_lossy(&body)
            ))),
        }
    }

    fn resolve(&self) -> Result<SocketAddr> {
        let endpoint = self.endpoint();
        endpoint
            .to_socket_addrs()
            .map_err(|e| self.error(format!("MASTER_ADDR {endpoint}: {e}")))?
            .next()
            .ok_or_else(|| self.error(format!("MASTER_ADDR {endpoint}: no address")))
    }
}

/// The ranks besides 0 that have not joined.
fn missing_ranks(world: usize, joined: &[(usize, TcpStream)]) -> Vec<usize> {
    (1..world)
        .filter(|r| !joined.iter().any(|(j, _)| j == r))
        .collect()
}

/// Tells every rank that came that the group is refused, and why.
fn refuse_all(joined: &mut [(usize, TcpStream)], msg: &str) {
    for (_, s) in joined.iter_mut() {
        let _ = send_reply(s, 1, msg.as_bytes());
    }
}

fn send_reply(stream: &mut TcpStream, status: u8, body: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(status);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    stream.write_all(&out)
}

fn read_reply(stream: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_BODY {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("an answer of {len} bytes (at most {MAX_BODY})"),
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok((head[0], body))
}
