//! The ledger's optional timeline: every allocation, free and change of
//! category, in order, with where and when it happened.

use super::{Category, CategoryBytes, Phase};
use crate::Device;
use serde::Serialize;
use std::sync::Arc;

/// What happened to an allocation's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Counted: `bytes` more live in `category`.
    Alloc,
    /// Uncounted: `bytes` fewer live in `category`.
    Free,
    /// Moved from `from` to `category` (saved for backward, released, or a
    /// gradient reaching a leaf): the device's total does not change.
    Move,
}

/// One entry of a ledger's timeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TimelineEvent {
    /// What happened.
    pub kind: EventKind,
    /// The device (`cpu`, `meta`, `cuda:0`).
    #[serde(serialize_with = "display")]
    pub device: Device,
    /// The allocation's exact size.
    pub bytes: usize,
    /// The category the bytes are in after the event (the one they left, for a free).
    pub category: Category,
    /// For a move, the category the bytes left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<Category>,
    /// The layer path the event happened in ("" outside any layer); in
    /// backward, the layer whose node was running.
    #[serde(serialize_with = "path")]
    pub scope: Option<Arc<str>>,
    /// The kernel or backward node that ran last on the thread ("" if none).
    pub op: &'static str,
    /// The phase of the step ([`crate::memory::Ledger::set_phase`]).
    pub phase: Phase,
    /// The device's live bytes, all categories, after the event.
    pub live: usize,
}

fn display<S: serde::Serializer>(d: &Device, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&d.to_string())
}

fn path<S: serde::Serializer>(p: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.as_deref().unwrap_or(""))
}

/// The live bytes of every category after each of `events` (those of one
/// device), replayed from an empty device: what a plot stacks. A timeline
/// started on a ledger that already held bytes replays frees of those as
/// nothing (it cannot know them).
pub fn replay(events: &[TimelineEvent]) -> Vec<CategoryBytes> {
    let mut live = CategoryBytes::default();
    events
        .iter()
        .map(|e| {
            match e.kind {
                EventKind::Alloc => live.add(e.category, e.bytes),
                EventKind::Free => live.sub(e.category, e.bytes),
                EventKind::Move => {
                    live.sub(e.from.unwrap_or(e.category), e.bytes);
                    live.add(e.category, e.bytes);
                }
            }
            live.clone()
        })
        .collect()
}
