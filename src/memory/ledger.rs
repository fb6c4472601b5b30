//! The ledger itself: exact live and peak bytes per device and category.

use super::report::{CategoryBytes, DeviceReport, LayerBytes, MemoryReport};
use super::Category;
use crate::{Device, Error, Result};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

#[derive(Default)]
struct DeviceStats {
    live: [usize; 6],
    peak: [usize; 6],
    live_total: usize,
    peak_total: usize,
    allocations: u64,
    limit: Option<usize>,
    param_grad_live: usize,
    param_grad_peak: usize,
    saved_live: BTreeMap<Arc<str>, usize>,
    saved_peak: BTreeMap<Arc<str>, usize>,
}

impl DeviceStats {
    fn add(&mut self, category: Category, bytes: usize) {
        let i = category.index();
        self.live[i] += bytes;
        self.peak[i] = self.peak[i].max(self.live[i]);
        self.live_total += bytes;
        self.peak_total = self.peak_total.max(self.live_total);
    }

    fn sub(&mut self, category: Category, bytes: usize) {
        self.live[category.index()] -= bytes;
        self.live_total -= bytes;
    }

    fn add_saved(&mut self, label: &Arc<str>, bytes: usize) {
        let live = self.saved_live.entry(label.clone()).or_default();
        *live += bytes;
        let live = *live;
        let peak = self.saved_peak.entry(label.clone()).or_default();
        *peak = (*peak).max(live);
    }

    fn sub_saved(&mut self, label: &Arc<str>, bytes: usize) {
        if let Some(live) = self.saved_live.get_mut(label) {
            *live -= bytes;
        }
    }
}

struct Entry {
    device: Device,
    bytes: usize,
    base: Category,
    saved_refs: usize,
    saved_label: Option<Arc<str>>,
    param_grad: bool,
}

impl Entry {
    /// Saving a parameter or optimizer state keeps nothing extra alive.
    fn counts_as_saved(&self) -> bool {
        self.saved_refs > 0 && !matches!(self.base, Category::Parameter | Category::OptimizerState)
    }

    fn effective(&self) -> Category {
        if self.counts_as_saved() {
            Category::Saved
        } else {
            self.base
        }
    }
}

#[derive(Default)]
struct LedgerState {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    devices: BTreeMap<Device, DeviceStats>,
}

impl LedgerState {
    /// Removes an entry's bytes from the stats, applies `change`, adds them back.
    fn recount(&mut self, id: u64, change: impl FnOnce(&mut Entry)) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        let stats = self.devices.entry(entry.device).or_default();
        stats.sub(entry.effective(), entry.bytes);
        if entry.counts_as_saved() {
            if let Some(label) = &entry.saved_label {
                stats.sub_saved(label, entry.bytes);
            }
        }
        change(entry);
        if entry.saved_refs == 0 {
            entry.saved_label = None;
        }
        stats.add(entry.effective(), entry.bytes);
        if entry.counts_as_saved() {
            if let Some(label) = &entry.saved_label {
                stats.add_saved(label, entry.bytes);
            }
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
        let stats = st.devices.entry(device).or_default();
        // Past usize (only the meta device, which holds no data, gets
        // there) is out of memory too.
        let total = stats.live_total.checked_add(bytes);
        if total.is_none_or(|t| stats.limit.is_some_and(|limit| t > limit)) {
            let live = stats.live_total;
            drop(st);
            return Err(self.out_of_memory(device, bytes, live));
        }
        stats.add(category, bytes);
        stats.allocations += 1;
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
                param_grad: false,
            },
        );
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

    /// Live bytes of gradients that have reached a parameter (a leaf): the
    /// pending gradient of a leaf, its `.grad`, an accumulation buffer.
    /// Activation gradients in flight between ops are not included.
    pub fn live_param_gradients(&self, device: Device) -> usize {
        self.with_stats(device, |s| s.param_grad_live)
    }

    /// Peak of [`Ledger::live_param_gradients`].
    pub fn peak_param_gradients(&self, device: Device) -> usize {
        self.with_stats(device, |s| s.param_grad_peak)
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

    /// Makes every peak equal to the current live value.
    pub fn reset_peak(&self) {
        let mut st = self.state();
        for s in st.devices.values_mut() {
            s.peak = s.live;
            s.peak_total = s.live_total;
            s.param_grad_peak = s.param_grad_live;
            for (k, v) in s.saved_peak.iter_mut() {
                *v = s.saved_live.get(k).copied().unwrap_or(0);
            }
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
                    parameter_gradient_live: s.param_grad_live,
                    parameter_gradient_peak: s.param_grad_peak,
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
        let stats = st.devices.entry(entry.device).or_default();
        stats.sub(entry.effective(), entry.bytes);
        if entry.param_grad {
            stats.param_grad_live -= entry.bytes;
        }
        if entry.counts_as_saved() {
            if let Some(label) = &entry.saved_label {
                stats.sub_saved(label, entry.bytes);
            }
        }
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

    /// Records that this allocation holds a parameter's (leaf's) gradient;
    /// counted once, until it is freed.
    pub fn mark_param_gradient(&self) {
        let mut st = self.ledger.state();
        let Some(entry) = st.entries.get_mut(&self.id) else {
            return;
        };
        if entry.param_grad {
            return;
        }
        entry.param_grad = true;
        let (device, bytes) = (entry.device, entry.bytes);
        let stats = st.devices.entry(device).or_default();
        stats.param_grad_live += bytes;
        stats.param_grad_peak = stats.param_grad_peak.max(stats.param_grad_live);
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
