//! The ledger itself: exact live and peak bytes per device and category,
//! the moment of each device's peak, and (when asked) the timeline.

use super::report::{CategoryBytes, DeviceReport, LayerBytes, MemoryReport, PeakMoment};
use super::scope::{current_site, note_op};
use super::stats::{DeviceStats, Site};
use super::timeline::{EventKind, TimelineEvent};
use super::{Category, Phase};
use crate::{Device, Error, Result};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

struct Entry {
    device: Device,
    bytes: usize,
    base: Category,
    saved_refs: usize,
    saved_label: Option<Arc<str>>,
    /// Set once the bytes hold a leaf's gradient: [`Category::ParameterGradient`]
    /// or [`Category::InputGradient`].
    leaf_gradient: Option<Category>,
}

/// Parameters and optimizer state are alive regardless of the graph:
/// saving them keeps nothing extra alive, and they never become gradients.
fn is_model_state(category: Category) -> bool {
    matches!(category, Category::Parameter | Category::OptimizerState)
}

impl Entry {
    fn counts_as_saved(&self) -> bool {
        self.saved_refs > 0 && !is_model_state(self.base)
    }

    fn effective(&self) -> Category {
        if self.counts_as_saved() {
            Category::Saved
        } else if is_model_state(self.base) {
            self.base
        } else {
            self.leaf_gradient.unwrap_or(self.base)
        }
    }
}

#[derive(Default)]
struct LedgerState {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    devices: BTreeMap<Device, DeviceStats>,
    phase: Phase,
    /// `Some` while the timeline is recorded.
    timeline: Option<Vec<TimelineEvent>>,
}

impl LedgerState {
    /// Appends an event, if the timeline is recorded.
    fn record(
        &mut self,
        kind: EventKind,
        device: Device,
        bytes: usize,
        category: Category,
        from: Option<Category>,
    ) {
        let Some(timeline) = self.timeline.as_mut() else {
            return;
        };
        let (scope, op) = current_site();
        let live = self.devices.get(&device).map_or(0, |s| s.live_total);
        timeline.push(TimelineEvent {
            kind,
            device,
            bytes,
            category,
            from,
            scope,
            op,
            phase: self.phase,
            live,
        });
    }

    /// Removes an entry's bytes from the stats, applies `change`, adds them back.
    fn recount(&mut self, id: u64, change: impl FnOnce(&mut Entry)) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        let before = entry.effective();
        let stats = self.devices.entry(entry.device).or_default();
        stats.sub(before, entry.bytes);
        if entry.counts_as_saved() {
            if let Some(label) = &entry.saved_label {
                stats.sub_saved(label, entry.bytes);
            }
        }
        change(entry);
        if entry.saved_refs == 0 {
            entry.saved_label = None;
        }
        let after = entry.effective();
        // The same bytes come back: the total cannot reach a new peak here.
        stats.add(after, entry.bytes);
        if entry.counts_as_saved() {
            if let Some(label) = &entry.saved_label {
                stats.add_saved(label, entry.bytes);
            }
        }
        if before != after {
            let (device, bytes) = (entry.device, entry.bytes);
            self.record(EventKind::Move, device, bytes, after, Some(before));
        }
    }
}

/// A memory ledger: live and peak bytes by device, category and saving layer.
///
/// Cloning gives another handle to the same ledger.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<LedgerState>>);

thread_local! {
    static CURRENT: RefCell<Vec<Ledger>> = const { RefCell::new(Vec::new()) };
}

/// Makes the previous ledger current again when dropped.
pub struct LedgerGuard(());

impl Drop for LedgerGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.borrow_mut().pop());
    }
}

impl Ledger {
    /// A new, empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// The process-wide ledger, used when no other is entered.
    pub fn global() -> Ledger {
        static GLOBAL: OnceLock<Ledger> = OnceLock::new();
        GLOBAL.get_or_init(Ledger::new).clone()
    }

    /// The ledger that allocations made now on this thread are counted in.
    pub fn current() -> Ledger {
        CURRENT
            .with(|c| c.borrow().last().cloned())
            .unwrap_or_else(Ledger::global)
    }

    /// Counts allocations made on this thread in this ledger until the guard drops.
    pub fn enter(&self) -> LedgerGuard {
        CURRENT.with(|c| c.borrow_mut().push(self.clone()));
        LedgerGuard(())
    }

    /// Turns the timeline on or off: while on, every allocation, free and
    /// change of category on any device is kept as a [`TimelineEvent`]
    /// (`Ledger::new().record_timeline(true)`). Off by default; off, the
    /// ledger keeps no events and reads no extra context.
    pub fn record_timeline(self, on: bool) -> Ledger {
        {
            let mut st = self.state();
            match (on, st.timeline.is_some()) {
                (true, false) => st.timeline = Some(Vec::new()),
                (false, true) => st.timeline = None,
                _ => {}
            }
        }
        self
    }

    /// The events recorded so far (empty unless [`Ledger::record_timeline`]
    /// is on), in order, every device together.
    pub fn timeline(&self) -> Vec<TimelineEvent> {
        self.state().timeline.clone().unwrap_or_default()
    }

    /// Marks the start of a phase of a training step: the peak and the
    /// timeline events from now on carry it (and no op of the previous
    /// phase is named for them on this thread).
    pub fn set_phase(&self, phase: Phase) {
        self.state().phase = phase;
        note_op("");
    }

    /// The phase set last ([`Phase::Setup`] at first).
    pub fn phase(&self) -> Phase {
        self.state().phase
    }

    fn state(&self) -> MutexGuard<'_, LedgerState> {
        // A poisoned ledger still holds correct counts: each update is done
        // under the lock in one step.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets (or clears) a byte limit for a device; a registration past it is
    /// an [`Error::OutOfMemory`]. Useful to rehearse small devices.
    pub fn set_limit(&self, device: Device, limit: Option<usize>) {
        self.state().devices.entry(device).or_default().limit = limit;
    }

    /// Counts `bytes` on `device` under `category`; the allocation is
    /// uncounted when the returned handle drops.
    pub fn register(&self, device: Device, bytes: usize, category: Category) -> Result<Allocation> {
        let mut st = self.state();
        let phase = st.phase;
        let stats = st.devices.entry(device).or_default();
        // Past usize (only the meta device, which holds no data, gets
        // there) is out of memory too.
        let total = stats.live_total.checked_add(bytes);
        if total.is_none_or(|t| stats.limit.is_some_and(|limit| t > limit)) {
            let live = stats.live_total;
            drop(st);
            return Err(self.out_of_memory(device, bytes, live));
        }
        stats.allocations += 1;
        if stats.add(category, bytes) {
            let (scope, op) = current_site();
            stats.peak_site = Site {
                scope,
                op,
                phase,
                allocation: stats.allocations,
            };
        }
        let id = st.next_id;
        st.next_id += 1;
        st.entries.insert(
            id,
            Entry {
                device,
                bytes,
                base: category,
                saved_refs: 0,
                saved_label: None,
                leaf_gradient: None,
            },
        );
        st.record(EventKind::Alloc, device, bytes, category, None);
        Ok(Allocation {
            ledger: self.clone(),
            id,
        })
    }

    /// The out-of-memory error for a request, with this ledger's summary.
    pub fn out_of_memory(&self, device: Device, requested: usize, live: usize) -> Error {
        Error::OutOfMemory {
            device,
            requested,
            live,
            summary: self.report().to_table(),
        }
    }

    fn with_stats<R>(&self, device: Device, f: impl FnOnce(&DeviceStats) -> R) -> R {
        let st = self.state();
        match st.devices.get(&device) {
            Some(s) => f(s),
            None => f(&DeviceStats::default()),
        }
    }

    /// Live bytes on `device`.
    pub fn live(&self, device: Device) -> usize {
        self.with_stats(device, |s| s.live_total)
    }

    /// Peak live bytes on `device` since creation or the last [`Ledger::reset_peak`].
    pub fn peak(&self, device: Device) -> usize {
        self.with_stats(device, |s| s.peak_total)
    }

    /// Live bytes on `device` in `category`.
    pub fn live_in(&self, device: Device, category: Category) -> usize {
        self.with_stats(device, |s| s.live[category.index()])
    }

    /// Peak bytes on `device` in `category`.
    pub fn peak_in(&self, device: Device, category: Category) -> usize {
        self.with_stats(device, |s| s.peak[category.index()])
    }

    /// Number of allocations ever registered on `device`.
    pub fn allocation_count(&self, device: Device) -> u64 {
        self.with_stats(device, |s| s.allocations)
    }

    /// Live bytes of the three gradient categories together.
    pub fn live_gradients(&self, device: Device) -> usize {
        self.with_stats(device, |s| s.gradients_live)
    }

    /// The most bytes the three gradient categories held at once (each
    /// category's own peak is [`Ledger::peak_in`]).
    pub fn peak_gradients(&self, device: Device) -> usize {
        self.with_stats(device, |s| s.gradients_peak)
    }

    /// Live bytes by category at the first moment the peak of `device` was
    /// reached; they add up to [`Ledger::peak`].
    pub fn at_peak(&self, device: Device) -> CategoryBytes {
        self.with_stats(device, |s| CategoryBytes::from_array(s.at_peak))
    }

    /// Live saved-for-backward bytes on `device`, by the layer/op that saved them.
    pub fn saved_by_layer(&self, device: Device) -> Vec<(String, usize)> {
        self.with_stats(device, |s| {
            s.saved_live
                .iter()
                .filter(|(_, &b)| b > 0)
                .map(|(k, &b)| (k.to_string(), b))
                .collect()
        })
    }

    /// Makes every peak equal to the current live value (the peak moment
    /// becomes now).
    pub fn reset_peak(&self) {
        let mut st = self.state();
        let (scope, op) = current_site();
        let now = Site {
            scope,
            op,
            phase: st.phase,
            allocation: 0,
        };
        for s in st.devices.values_mut() {
            s.reset_peak(now.clone());
        }
    }

    /// A snapshot of every device's counts.
    pub fn report(&self) -> MemoryReport {
        let st = self.state();
        let devices = st
            .devices
            .iter()
            .map(|(&device, s)| {
                let mut saved_by_layer: Vec<LayerBytes> = s
                    .saved_peak
                    .iter()
                    .map(|(k, &peak)| LayerBytes {
                        layer: k.to_string(),
                        live: s.saved_live.get(k).copied().unwrap_or(0),
                        peak,
                    })
                    .collect();
                saved_by_layer.sort_by(|a, b| b.peak.cmp(&a.peak).then(a.layer.cmp(&b.layer)));
                DeviceReport {
                    device: device.to_string(),
                    live_total: s.live_total,
                    peak_total: s.peak_total,
                    allocations: s.allocations,
                    live: CategoryBytes::from_array(s.live),
                    peak: CategoryBytes::from_array(s.peak),
                    at_peak: PeakMoment {
                        bytes: CategoryBytes::from_array(s.at_peak),
                        phase: s.peak_site.phase,
                        scope: s.peak_site.scope.as_deref().unwrap_or("").to_string(),
                        op: s.peak_site.op.to_string(),
                        allocation: s.peak_site.allocation,
                    },
                    gradients_live: s.gradients_live,
                    gradients_peak: s.gradients_peak,
                    saved_by_layer,
                }
            })
            .collect();
        MemoryReport { devices }
    }

    fn free(&self, id: u64) {
        let mut st = self.state();
        let Some(entry) = st.entries.remove(&id) else {
            return;
        };
        let category = entry.effective();
        let stats = st.devices.entry(entry.device).or_default();
        stats.sub(category, entry.bytes);
        if entry.counts_as_saved() {
            if let Some(label) = &entry.saved_label {
                stats.sub_saved(label, entry.bytes);
            }
        }
        st.record(EventKind::Free, entry.device, entry.bytes, category, None);
    }
}

/// One counted allocation; uncounted when dropped.
pub struct Allocation {
    ledger: Ledger,
    id: u64,
}

impl Allocation {
    /// The ledger this allocation is counted in.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Records that an autograd node holds this allocation for backward.
    /// The first holder's label names it in the by-layer report.
    pub fn mark_saved(&self, label: &str) {
        self.ledger.state().recount(self.id, |e| {
            e.saved_refs += 1;
            if e.saved_label.is_none() {
                e.saved_label = Some(Arc::from(label));
            }
        });
    }

    /// Records that one holder released it.
    pub fn unmark_saved(&self) {
        self.ledger
            .state()
            .recount(self.id, |e| e.saved_refs = e.saved_refs.saturating_sub(1));
    }

    /// Records that this allocation holds a leaf's gradient, from now until
    /// it is freed: counted as [`Category::ParameterGradient`] when the leaf
    /// is a parameter, else as [`Category::InputGradient`]. The first call
    /// decides; parameters and optimizer state are never moved.
    pub fn mark_leaf_gradient(&self, leaf_is_parameter: bool) {
        let kind = if leaf_is_parameter {
            Category::ParameterGradient
        } else {
            Category::InputGradient
        };
        let mut st = self.ledger.state();
        match st.entries.get(&self.id) {
            Some(e) if e.leaf_gradient.is_none() && !is_model_state(e.base) => {}
            _ => return,
        }
        st.recount(self.id, |e| e.leaf_gradient = Some(kind));
    }

    /// Whether some autograd node holds this allocation for backward now.
    pub fn is_saved(&self) -> bool {
        self.ledger
            .state()
            .entries
            .get(&self.id)
            .is_some_and(|e| e.saved_refs > 0)
    }

    /// The allocation's own category (what it returns to when no longer saved).
    pub fn category(&self) -> Option<Category> {
        self.ledger.state().entries.get(&self.id).map(|e| e.base)
    }

    /// Moves the allocation to another category (e.g. a tensor becoming a parameter).
    pub fn set_category(&self, category: Category) {
        self.ledger.state().recount(self.id, |e| e.base = category);
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.ledger.free(self.id);
    }
}
