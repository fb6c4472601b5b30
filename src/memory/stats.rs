//! One device's counts: live and peak bytes by category, the breakdown at
//! the moment of the peak and where it was reached, saved bytes by label.

use super::{Category, Phase};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How many categories there are.
pub(super) const CATEGORIES: usize = Category::ALL.len();

/// Where and when something happened: the layer path, the op, the phase,
/// and how many allocations the device had seen by then.
#[derive(Clone, Default)]
pub(super) struct Site {
    pub(super) scope: Option<Arc<str>>,
    pub(super) op: &'static str,
    pub(super) phase: Phase,
    pub(super) allocation: u64,
}

#[derive(Default)]
pub(super) struct DeviceStats {
    pub(super) live: [usize; CATEGORIES],
    pub(super) peak: [usize; CATEGORIES],
    pub(super) live_total: usize,
    pub(super) peak_total: usize,
    /// The three gradient categories together (their own peaks need not
    /// coincide, so this peak is not the sum of theirs).
    pub(super) gradients_live: usize,
    pub(super) gradients_peak: usize,
    /// `live` at the first moment `live_total` reached `peak_total`.
    pub(super) at_peak: [usize; CATEGORIES],
    pub(super) peak_site: Site,
    pub(super) allocations: u64,
    pub(super) limit: Option<usize>,
    pub(super) saved_live: BTreeMap<Arc<str>, usize>,
    pub(super) saved_peak: BTreeMap<Arc<str>, usize>,
}

impl DeviceStats {
    /// Counts `bytes` in `category`; true when the device's total reached a
    /// new peak (the caller then records where it was reached).
    pub(super) fn add(&mut self, category: Category, bytes: usize) -> bool {
        let i = category.index();
        self.live[i] += bytes;
        self.peak[i] = self.peak[i].max(self.live[i]);
        if category.is_gradient() {
            self.gradients_live += bytes;
            self.gradients_peak = self.gradients_peak.max(self.gradients_live);
        }
        self.live_total += bytes;
        if self.live_total > self.peak_total {
            self.peak_total = self.live_total;
            self.at_peak = self.live;
            true
        } else {
            false
        }
    }

    pub(super) fn sub(&mut self, category: Category, bytes: usize) {
        self.live[category.index()] -= bytes;
        if category.is_gradient() {
            self.gradients_live -= bytes;
        }
        self.live_total -= bytes;
    }

    pub(super) fn add_saved(&mut self, label: &Arc<str>, bytes: usize) {
        let live = self.saved_live.entry(label.clone()).or_default();
        *live += bytes;
        let live = *live;
        let peak = self.saved_peak.entry(label.clone()).or_default();
        *peak = (*peak).max(live);
    }

    pub(super) fn sub_saved(&mut self, label: &Arc<str>, bytes: usize) {
        if let Some(live) = self.saved_live.get_mut(label) {
            *live -= bytes;
        }
    }

    /// Makes every peak the live value; the peak moment becomes `now`.
    pub(super) fn reset_peak(&mut self, now: Site) {
        self.peak = self.live;
        self.peak_total = self.live_total;
        self.gradients_peak = self.gradients_live;
        self.at_peak = self.live;
        self.peak_site = Site {
            allocation: self.allocations,
            ..now
        };
        for (k, v) in self.saved_peak.iter_mut() {
            *v = self.saved_live.get(k).copied().unwrap_or(0);
        }
    }
}
