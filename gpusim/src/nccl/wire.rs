//! The messages between the processes of one communicator, and their
//! bytes.
//!
//! A message is one frame: its length (u64, little-endian), then a tag
//! byte and the fields — integers little-endian, byte strings and texts as
//! a u64 length and the bytes, lists as a u64 count and the elements.
//! Nothing read from another process is trusted: a frame that is too long,
//! cut short, has bytes left over, an unknown tag or a value out of range
//! is an error (the connection then counts as lost); the receivers check
//! ranks, keys and lengths against the communicator (`net`, `join`).

use super::outcome::{Contrib, Input, Outcome};
use super::reduce::{DataType, RedOp};
use super::state::{Call, Failure, Key, Kind};
use crate::driver::consts::{CUresult, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED};
use std::io::Read;

/// The first field of every `Hello`: the protocol and its version.
pub const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"gpusimN1");

/// The longest frame accepted (1 TiB: more than any simulated device).
pub const MAX_FRAME: u64 = 1 << 40;

/// How far one rank got: operations it enqueued on its communicator, so
/// that the hub knows which parts of an ended rank are still to come.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Collectives enqueued.
    pub coll: u64,
    /// Sends enqueued, by peer.
    pub sent: Vec<(usize, u64)>,
    /// Receives enqueued, by peer.
    pub received: Vec<(usize, u64)>,
}

/// One message.
#[derive(Clone, Debug)]
pub enum Msg {
    /// Member → hub, first on a connection: which unique id (its serial
    /// and creator's process id) and who is asking.
    Hello {
        /// The unique id's serial.
        serial: u64,
        /// The process the unique id names as its creator.
        creator: u32,
        /// The connecting process.
        pid: u32,
    },
    /// Member → hub: a rank joins (`ncclCommInitRank`).
    Join {
        /// The rank.
        rank: usize,
        /// The `nranks` it passed.
        nranks: usize,
        /// Its device in its process.
        device: usize,
    },
    /// Hub → member: every rank joined; each rank's process and device.
    Welcome {
        /// By rank: (process id, device).
        ranks: Vec<(u32, usize)>,
    },
    /// Hub → member: the rendezvous failed.
    JoinFailed(Failure),
    /// Member → hub: the member's ranks' parts of an operation.
    Contribute {
        /// The operation.
        key: Key,
        /// The parts.
        parts: Vec<Contrib>,
    },
    /// Hub → member: some ranks have reached an operation (the member's
    /// ranks should run their queues up to it, as a GPU would).
    Progress {
        /// The operation.
        key: Key,
        /// The ranks whose parts the hub holds.
        ranks: Vec<usize>,
    },
    /// Hub → member: what an operation came to for the member's ranks.
    Result {
        /// The operation.
        key: Key,
        /// By rank.
        outcomes: Vec<(usize, Outcome)>,
        /// The operation's failure, if it failed.
        failure: Option<Failure>,
    },
    /// Member → hub: a rank's handle ended ("destroyed", "aborted",
    /// "finalized") after enqueuing what `counts` says.
    Gone {
        /// The rank.
        rank: usize,
        /// How.
        how: String,
        /// What it had enqueued.
        counts: Counts,
    },
    /// Either way: the communicator broke (a timeout, a lost process).
    Broken(Failure),
}

impl Msg {
    /// The message's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello { .. } => "Hello",
            Msg::Join { .. } => "Join",
            Msg::Welcome { .. } => "Welcome",
            Msg::JoinFailed(_) => "JoinFailed",
            Msg::Contribute { .. } => "Contribute",
            Msg::Progress { .. } => "Progress",
            Msg::Result { .. } => "Result",
            Msg::Gone { .. } => "Gone",
            Msg::Broken(_) => "Broken",
        }
    }
}

/// A message being written.
struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn failure(&mut self, f: &Failure) {
        self.u32(f.code);
        self.bytes(f.msg.as_bytes());
    }
    fn key(&mut self, k: Key) {
        match k {
            Key::Coll(s) => {
                self.u8(0);
                self.u64(s);
            }
            Key::P2p { src, dst, n } => {
                self.u8(1);
                self.u64(src as u64);
                self.u64(dst as u64);
                self.u64(n);
            }
        }
    }
    fn call(&mut self, c: &Call) {
        self.u8(KINDS.iter().position(|&k| k == c.kind).unwrap_or(0) as u8);
        self.u64(c.send);
        self.u64(c.recv);
        self.u64(c.count as u64);
        self.u32(c.dtype.to_raw());
        self.u32(c.op.to_raw());
        self.u64(c.root as u64);
    }
    fn counts(&mut self, c: &Counts) {
        self.u64(c.coll);
        for list in [&c.sent, &c.received] {
            self.u64(list.len() as u64);
            for &(peer, n) in list {
                self.u64(peer as u64);
                self.u64(n);
            }
        }
    }
    fn outcome(&mut self, o: &Outcome) {
        match o {
            Outcome::Write(b) => {
                self.u8(0);
                self.bytes(b);
            }
            Outcome::Fault(f, cuda) => {
                self.u8(1);
                self.failure(f);
                self.u32(*cuda);
            }
            Outcome::Skip => self.u8(2),
            Outcome::Nothing => self.u8(3),
        }
    }
    fn input(&mut self, i: &Input) {
        match i {
            Input::Data(b) => {
                self.u8(0);
                self.bytes(b);
            }
            Input::Unreadable(why) => {
                self.u8(1);
                self.bytes(why.as_bytes());
            }
            Input::Skipped => self.u8(2),
        }
    }
}

/// The calls by wire number.
const KINDS: [Kind; 7] = [
    Kind::AllReduce,
    Kind::Broadcast,
    Kind::Reduce,
    Kind::AllGather,
    Kind::ReduceScatter,
    Kind::Send,
    Kind::Recv,
];

/// The frame of `m`: its length, then its bytes.
pub fn encode(m: &Msg) -> Vec<u8> {
    let mut e = Enc(vec![0; 8]);
    match m {
        Msg::Hello {
            serial,
            creator,
            pid,
        } => {
            e.u8(1);
            e.u64(HELLO_MAGIC);
            e.u64(*serial);
            e.u32(*creator);
            e.u32(*pid);
        }
        Msg::Join {
            rank,
            nranks,
            device,
        } => {
            e.u8(2);
            for v in [rank, nranks, device] {
                e.u64(*v as u64);
            }
        }
        Msg::Welcome { ranks } => {
            e.u8(3);
            e.u64(ranks.len() as u64);
            for &(pid, dev) in ranks {
                e.u32(pid);
                e.u64(dev as u64);
            }
        }
        Msg::JoinFailed(f) => {
            e.u8(4);
            e.failure(f);
        }
        Msg::Contribute { key, parts } => {
            e.u8(5);
            e.key(*key);
            e.u64(parts.len() as u64);
            for p in parts {
                e.u64(p.rank as u64);
                e.call(&p.call);
                e.input(&p.input);
            }
        }
        Msg::Progress { key, ranks } => {
            e.u8(6);
            e.key(*key);
            e.u64(ranks.len() as u64);
            for &r in ranks {
                e.u64(r as u64);
            }
        }
        Msg::Result {
            key,
            outcomes,
            failure,
        } => {
            e.u8(7);
            e.key(*key);
            e.u64(outcomes.len() as u64);
            for (r, o) in outcomes {
                e.u64(*r as u64);
                e.outcome(o);
            }
            match failure {
                Some(f) => {
                    e.u8(1);
                    e.failure(f);
                }
                None => e.u8(0),
            }
        }
        Msg::Gone { rank, how, counts } => {
            e.u8(8);
            e.u64(*rank as u64);
            e.bytes(how.as_bytes());
            e.counts(counts);
        }
        Msg::Broken(f) => {
            e.u8(9);
            e.failure(f);
        }
    }
    let len = (e.0.len() - 8) as u64;
    e.0[..8].copy_from_slice(&len.to_le_bytes());
    e.0
}

/// A message being read: the rest of its bytes.
struct Dec<'a>(&'a [u8]);

type DResult<T> = Result<T, String>;

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> DResult<&'a [u8]> {
        if n > self.0.len() {
            return Err(format!(
                "cut short: {n} byte(s) wanted, {} left",
                self.0.len()
            ));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> DResult<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> DResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> DResult<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    /// A count, index or length: it must fit what is left of the message
    /// when `per` bytes at least stand for each unit.
    fn len(&mut self, per: usize) -> DResult<usize> {
        let v = self.u64()?;
        match usize::try_from(v) {
            Ok(n) if n.saturating_mul(per) <= self.0.len() => Ok(n),
            _ => Err(format!("a length of {v} is more than the message holds")),
        }
    }
    /// A rank, device or peer number (well below 2^32).
    fn small(&mut self) -> DResult<usize> {
        let v = self.u64()?;
        match u32::try_from(v) {
            Ok(n) => Ok(n as usize),
            Err(_) => Err(format!("{v} is out of range for a rank or device")),
        }
    }
    fn bytes(&mut self) -> DResult<Vec<u8>> {
        let n = self.len(1)?;
        Ok(self.take(n)?.to_vec())
    }
    fn text(&mut self) -> DResult<String> {
        String::from_utf8(self.bytes()?).map_err(|_| "a text is not UTF-8".to_string())
    }
    fn failure(&mut self) -> DResult<Failure> {
        let code = self.u32()?;
        if !(1..=8).contains(&code) {
            return Err(format!("{code} is not a failing ncclResult_t"));
        }
        Ok(Failure::new(code, self.text()?))
    }
    fn key(&mut self) -> DResult<Key> {
        match self.u8()? {
            0 => Ok(Key::Coll(self.u64()?)),
            1 => Ok(Key::P2p {
                src: self.small()?,
                dst: self.small()?,
                n: self.u64()?,
            }),
            t => Err(format!("key tag {t}")),
        }
    }
    fn call(&mut self) -> DResult<Call> {
        let k = self.u8()?;
        let kind = *KINDS.get(k as usize).ok_or(format!("call kind {k}"))?;
        let (send, recv) = (self.u64()?, self.u64()?);
        let count = usize::try_from(self.u64()?).map_err(|_| "a count out of range")?;
        let t = self.u32()?;
        let dtype = DataType::from_raw(t).ok_or(format!("datatype {t}"))?;
        let o = self.u32()?;
        let op = RedOp::from_raw(o).ok_or(format!("op {o}"))?;
        let root = self.small()?;
        Ok(Call {
            kind,
            send,
            recv,
            count,
            dtype,
            op,
            root,
        })
    }
    fn pairs(&mut self) -> DResult<Vec<(usize, u64)>> {
        let n = self.len(16)?;
        (0..n).map(|_| Ok((self.small()?, self.u64()?))).collect()
    }
    fn counts(&mut self) -> DResult<Counts> {
        Ok(Counts {
            coll: self.u64()?,
            sent: self.pairs()?,
            received: self.pairs()?,
        })
    }
    fn outcome(&mut self) -> DResult<Outcome> {
        Ok(match self.u8()? {
            0 => Outcome::Write(self.bytes()?),
            1 => {
                let f = self.failure()?;
                let cuda: CUresult = self.u32()?;
                if ![CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED].contains(&cuda) {
                    return Err(format!("CUresult {cuda} is not a NCCL fault's"));
                }
                Outcome::Fault(f, cuda)
            }
            2 => Outcome::Skip,
            3 => Outcome::Nothing,
            t => return Err(format!("outcome tag {t}")),
        })
    }
    fn input(&mut self) -> DResult<Input> {
        Ok(match self.u8()? {
            0 => Input::Data(self.bytes()?),
            1 => Input::Unreadable(self.text()?),
            2 => Input::Skipped,
            t => return Err(format!("input tag {t}")),
        })
    }
}

/// The message of one frame's bytes (without its length).
pub fn decode(b: &[u8]) -> DResult<Msg> {
    let mut d = Dec(b);
    let m = match d.u8()? {
        1 => {
            if d.u64()? != HELLO_MAGIC {
                return Err(
                    "not a gpusim NCCL hello (another program, or another version?)".into(),
                );
            }
            Msg::Hello {
                serial: d.u64()?,
                creator: d.u32()?,
                pid: d.u32()?,
            }
        }
        2 => Msg::Join {
            rank: d.small()?,
            nranks: d.small()?,
            device: d.small()?,
        },
        3 => {
            let n = d.len(12)?;
            let ranks = (0..n)
                .map(|_| Ok((d.u32()?, d.small()?)))
                .collect::<DResult<_>>()?;
            Msg::Welcome { ranks }
        }
        4 => Msg::JoinFailed(d.failure()?),
        5 => {
            let key = d.key()?;
            let n = d.len(8)?;
            let parts = (0..n)
                .map(|_| {
                    Ok(Contrib {
                        rank: d.small()?,
                        call: d.call()?,
                        input: d.input()?,
                    })
                })
                .collect::<DResult<_>>()?;
            Msg::Contribute { key, parts }
        }
        6 => {
            let key = d.key()?;
            let n = d.len(8)?;
            let ranks = (0..n).map(|_| d.small()).collect::<DResult<_>>()?;
            Msg::Progress { key, ranks }
        }
        7 => {
            let key = d.key()?;
            let n = d.len(9)?;
            let outcomes = (0..n)
                .map(|_| Ok((d.small()?, d.outcome()?)))
                .collect::<DResult<_>>()?;
            let failure = match d.u8()? {
                0 => None,
                1 => Some(d.failure()?),
                t => return Err(format!("option tag {t}")),
            };
            Msg::Result {
                key,
                outcomes,
                failure,
            }
        }
        8 => Msg::Gone {
            rank: d.small()?,
            how: d.text()?,
            counts: d.counts()?,
        },
        9 => Msg::Broken(d.failure()?),
        t => return Err(format!("message tag {t}")),
    };
    if !d.0.is_empty() {
        return Err(format!("{} byte(s) left over after a message", d.0.len()));
    }
    Ok(m)
}

/// Reads one frame's bytes from `r`: `Ok(None)` at a clean end of the
/// stream (between frames).
pub fn read_frame(r: &mut impl Read) -> Result<Option<Vec<u8>>, String> {
    let mut len = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err("the stream ended inside a frame's length".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(format!("a frame of {len} bytes is more than {MAX_FRAME}"));
    }
    let mut buf = Vec::new();
    r.take(len)
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())?;
    if buf.len() as u64 != len {
        return Err(format!(
            "the stream ended inside a frame ({} of {len} bytes)",
            buf.len()
        ));
    }
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_the_wire_and_bad_bytes_are_errors() {
        let call = Call {
            kind: Kind::ReduceScatter,
            send: 0x10,
            recv: 0x20,
            count: 3,
            dtype: DataType::Bf16,
            op: RedOp::Avg,
            root: 0,
        };
        let m = Msg::Contribute {
            key: Key::P2p {
                src: 1,
                dst: 2,
                n: 7,
            },
            parts: vec![Contrib {
                rank: 1,
                call,
                input: Input::Data(vec![1, 2, 3]),
            }],
        };
        let frame = encode(&m);
        let got = read_frame(&mut &frame[..]).unwrap().unwrap();
        assert_eq!(format!("{:?}", decode(&got).unwrap()), format!("{m:?}"));
        // Cut short, left over, unknown tag, absurd length.
        assert!(decode(&got[..got.len() - 1]).is_err());
        assert!(decode(&[got.clone(), vec![0]].concat()).is_err());
        assert!(decode(&[42]).is_err());
        let mut huge = vec![4u8];
        huge.extend_from_slice(&2u32.to_le_bytes());
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge).is_err());
        assert!(read_frame(&mut &u64::MAX.to_le_bytes()[..]).is_err());
        assert!(read_frame(&mut &[][..]).unwrap().is_none());
    }
}
