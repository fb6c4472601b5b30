//! Recording and replaying random draws, per thread: what makes a
//! checkpointed segment's recompute draw the dropout masks its forward drew.
//!
//! Frames nest as checkpoints do. A draw is taken from the innermost replay
//! frame if there is one (else from its generator) and appended to every
//! record frame opened after that replay frame.

use std::cell::RefCell;

/// One reservation: its length, and the (seed, offset) it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Draw {
    n: u64,
    seed: u64,
    offset: u64,
}

/// The draws a segment made, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrawLog {
    draws: Vec<Draw>,
}

impl DrawLog {
    /// How many reservations were recorded.
    pub fn len(&self) -> usize {
        self.draws.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.draws.is_empty()
    }
}

enum Frame {
    Record(Vec<Draw>),
    Replay {
        draws: Vec<Draw>,
        next: usize,
        /// The first reservation that did not match the log (its index).
        mismatch: Option<usize>,
    },
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// The (seed, offset) for a reservation of `n` counters by the generator of
/// `seed`, with `advance` taking them from the generator when no replay
/// frame is open (or the replayed log does not match).
pub(super) fn reserve(seed: u64, n: u64, advance: impl FnOnce() -> u64) -> (u64, u64) {
    let replayed = FRAMES.with(|f| {
        let mut frames = f.borrow_mut();
        let at = frames
            .iter()
            .rposition(|fr| matches!(fr, Frame::Replay { .. }))?;
        let Frame::Replay {
            draws,
            next,
            mismatch,
        } = &mut frames[at]
        else {
            return None;
        };
        let got = draws.get(*next).copied();
        *next += 1;
        match got {
            Some(d) if d.n == n && d.seed == seed => Some((at, d.offset)),
            _ => {
                mismatch.get_or_insert(*next - 1);
                None
            }
        }
    });
    let (first_recorder, offset) = match replayed {
        Some((at, offset)) => (at + 1, offset),
        None => (0, advance()),
    };
    FRAMES.with(|f| {
        for fr in f.borrow_mut().iter_mut().skip(first_recorder) {
            if let Frame::Record(draws) = fr {
                draws.push(Draw { n, seed, offset });
            }
        }
    });
    (seed, offset)
}

/// Pops its record frame when finished or dropped.
#[must_use = "the draws are recorded only while the guard lives"]
pub struct RecordGuard {
    depth: usize,
    done: bool,
}

/// Pops its replay frame when finished or dropped.
#[must_use = "the draws are replayed only while the guard lives"]
pub struct ReplayGuard {
    depth: usize,
    done: bool,
}

fn push(frame: Frame) -> usize {
    FRAMES.with(|f| {
        let mut frames = f.borrow_mut();
        frames.push(frame);
        frames.len()
    })
}

/// Pops frames down to (and including) the one at `depth` (1-based) and
/// returns it; frames above it were left open by guards that leaked.
fn pop(depth: usize) -> Option<Frame> {
    FRAMES.with(|f| {
        let mut frames = f.borrow_mut();
        if frames.len() < depth {
            return None;
        }
        frames.truncate(depth);
        frames.pop()
    })
}

/// Records every random reservation on this thread until the guard is
/// finished (which returns them) or dropped.
pub fn record_draws() -> RecordGuard {
    RecordGuard {
        depth: push(Frame::Record(Vec::new())),
        done: false,
    }
}

impl RecordGuard {
    /// Stops recording and returns the draws.
    pub fn finish(mut self) -> DrawLog {
        self.done = true;
        match pop(self.depth) {
            Some(Frame::Record(draws)) => DrawLog { draws },
            _ => DrawLog::default(),
        }
    }
}

impl Drop for RecordGuard {
    fn drop(&mut self) {
        if !self.done {
            pop(self.depth);
        }
    }
}

/// Hands `log`'s draws back, in order, to the reservations made on this
/// thread until the guard is finished or dropped.
pub fn replay_draws(log: &DrawLog) -> ReplayGuard {
    ReplayGuard {
        depth: push(Frame::Replay {
            draws: log.draws.clone(),
            next: 0,
            mismatch: None,
        }),
        done: false,
    }
}

impl ReplayGuard {
    /// Stops replaying; an error message unless the reservations were
    /// exactly the log's (the same count, lengths and generators).
    pub fn finish(mut self) -> Result<(), String> {
        self.done = true;
        match pop(self.depth) {
            Some(Frame::Replay {
                draws,
                next,
                mismatch,
            }) => match mismatch {
                Some(i) => Err(format!(
                    "random draw {i} differs from the forward's ({} recorded)",
                    draws.len()
                )),
                None if next != draws.len() => Err(format!(
                    "{next} random draws where the forward made {}",
                    draws.len()
                )),
                None => Ok(()),
            },
            _ => Err("the replay of random draws was closed early".into()),
        }
    }
}

impl Drop for ReplayGuard {
    fn drop(&mut self) {
        if !self.done {
            pop(self.depth);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Generator;
    use super::*;

    #[test]
    fn a_replay_hands_back_the_recorded_ranges_and_leaves_the_stream() {
        let g = Generator::new(7);
        g.reserve(3);
        let rec = record_draws();
        let a = g.reserve(10);
        let b = g.reserve(1);
        let log = rec.finish();
        assert_eq!(log.len(), 2);
        let after = g.reserve(1);
        let replay = replay_draws(&log);
        assert_eq!((g.reserve(10), g.reserve(1)), (a, b));
        replay.finish().unwrap();
        // The stream moved on only with the draws outside the replay.
        assert_eq!(g.reserve(1).1, after.1 + 4);
    }

    #[test]
    fn nested_records_see_replayed_draws_and_mismatches_are_reported() {
        let g = Generator::new(1);
        let outer = record_draws();
        let x = g.reserve(8);
        let inner = record_draws();
        let y = g.reserve(4);
        let inner_log = inner.finish();
        let outer_log = outer.finish();
        assert_eq!((outer_log.len(), inner_log.len()), (2, 1));
        // The outer recompute replays both; the inner segment, recorded
        // again inside it, gets the replayed draw.
        let replay = replay_draws(&outer_log);
        assert_eq!(g.reserve(8), x);
        let inner_again = record_draws();
        assert_eq!(g.reserve(4), y);
        assert_eq!(inner_again.finish(), inner_log);
        replay.finish().unwrap();

        let replay = replay_draws(&inner_log);
        g.reserve(5);
        assert!(replay.finish().unwrap_err().contains("differs"));
        let replay = replay_draws(&inner_log);
        assert!(replay.finish().unwrap_err().contains("0 random draws"));
    }
}
