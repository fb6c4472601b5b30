//! Ledger snapshots, printable as a table or serialisable as JSON.

use super::{Category, Phase};
use serde::Serialize;
use std::fmt::Write;

/// Bytes in each category (the JSON keys are [`Category::name`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CategoryBytes {
    /// [`Category::Parameter`]: model weights and buffers.
    pub parameters: usize,
    /// [`Category::OptimizerState`]: moments and momentum buffers.
    pub optimizer_state: usize,
    /// [`Category::Activation`]: forward outputs alive but not saved, inputs, results.
    pub activations: usize,
    /// [`Category::Saved`]: tensors held for backward.
    pub saved: usize,
    /// [`Category::Workspace`]: temporaries of running ops.
    pub workspace: usize,
    /// [`Category::ParameterGradient`]: gradients that reached a parameter.
    pub parameter_gradients: usize,
    /// [`Category::InputGradient`]: gradients that reached another leaf (an input).
    pub input_gradients: usize,
    /// [`Category::IntermediateGradient`]: gradients flowing in backward.
    pub intermediate_gradients: usize,
}

impl CategoryBytes {
    pub(crate) fn from_array(a: [usize; 8]) -> Self {
        let mut out = CategoryBytes::default();
        for (c, bytes) in Category::ALL.into_iter().zip(a) {
            *out.slot(c) = bytes;
        }
        out
    }

    fn slot(&mut self, category: Category) -> &mut usize {
        match category {
            Category::Parameter => &mut self.parameters,
            Category::OptimizerState => &mut self.optimizer_state,
            Category::Activation => &mut self.activations,
            Category::Saved => &mut self.saved,
            Category::Workspace => &mut self.workspace,
            Category::ParameterGradient => &mut self.parameter_gradients,
            Category::InputGradient => &mut self.input_gradients,
            Category::IntermediateGradient => &mut self.intermediate_gradients,
        }
    }

    /// The bytes in one category.
    pub fn get(&self, category: Category) -> usize {
        match category {
            Category::Parameter => self.parameters,
            Category::OptimizerState => self.optimizer_state,
            Category::Activation => self.activations,
            Category::Saved => self.saved,
            Category::Workspace => self.workspace,
            Category::ParameterGradient => self.parameter_gradients,
            Category::InputGradient => self.input_gradients,
            Category::IntermediateGradient => self.intermediate_gradients,
        }
    }

    /// Adds `bytes` to one category.
    pub fn add(&mut self, category: Category, bytes: usize) {
        *self.slot(category) += bytes;
    }

    /// Takes `bytes` from one category (never below zero).
    pub fn sub(&mut self, category: Category, bytes: usize) {
        let slot = self.slot(category);
        *slot = slot.saturating_sub(bytes);
    }

    /// The sum over all categories.
    pub fn total(&self) -> usize {
        Category::ALL.iter().map(|&c| self.get(c)).sum()
    }
}

/// The moment a device's peak was first reached: what was live, by
/// category, and what was running.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PeakMoment {
    /// Live bytes by category then; they add up to the peak exactly.
    pub bytes: CategoryBytes,
    /// The phase of the step then.
    pub phase: Phase,
    /// The layer path the peak was reached in ("" outside any layer; in
    /// backward, the layer whose node was running).
    pub scope: String,
    /// The kernel or backward node that ran last ("" if none).
    pub op: String,
    /// Which allocation on the device reached the peak (1 for the first).
    pub allocation: u64,
}

/// Saved-for-backward bytes held by one op in one layer scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerBytes {
    /// `scope/op` of the op that saved the bytes (`op` outside any scope).
    pub layer: String,
    /// Bytes it holds for backward now.
    pub live: usize,
    /// The most it held at once.
    pub peak: usize,
}

/// One device's counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceReport {
    /// The device's name (e.g. `cpu`, `cuda:0`).
    pub device: String,
    /// Bytes live now, all categories.
    pub live_total: usize,
    /// The most bytes live at once, all categories.
    pub peak_total: usize,
    /// Allocations ever counted on the device.
    pub allocations: u64,
    /// Bytes live now, per category (they add up to `live_total`).
    pub live: CategoryBytes,
    /// Each category's own peak (they need not coincide, so they may sum
    /// to more than `peak_total`).
    pub peak: CategoryBytes,
    /// The breakdown at the moment of the peak (adds up to `peak_total`).
    pub at_peak: PeakMoment,
    /// Live bytes of the three gradient categories together.
    pub gradients_live: usize,
    /// The most bytes the three gradient categories held at once.
    pub gradients_peak: usize,
    /// Sorted by peak bytes, largest first.
    pub saved_by_layer: Vec<LayerBytes>,
}

/// A snapshot of a ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryReport {
    /// One entry per device that has seen an allocation.
    pub devices: Vec<DeviceReport>,
}

/// Formats a byte count for people: exact bytes plus a binary-prefixed size.
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

impl PeakMoment {
    /// Where the peak was reached, for people: `backward, in layer1.0.conv1
    /// (conv2d_backward)`.
    pub fn describe(&self) -> String {
        let mut out = self.phase.name().to_string();
        if !self.scope.is_empty() {
            let _ = write!(out, ", in {}", self.scope);
        }
        if !self.op.is_empty() {
            let _ = write!(out, " ({})", self.op);
        }
        out
    }
}

impl MemoryReport {
    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as a text table: one block per device, categories as rows
    /// (live now, at the moment of the peak, own peak), then the layers
    /// holding the most saved bytes.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        if self.devices.is_empty() {
            out.push_str("memory ledger: nothing allocated\n");
        }
        for d in &self.devices {
            let _ = writeln!(
                out,
                "memory ledger on {} ({} allocations)",
                d.device, d.allocations
            );
            let row =
                |out: &mut String, name: &str, live: usize, at: usize, peak: Option<usize>| {
                    let _ = writeln!(
                        out,
                        "  {name:<24} {:>12} {:>12} {:>12}",
                        human_bytes(live),
                        human_bytes(at),
                        peak.map(human_bytes).unwrap_or_default()
                    );
                };
            let _ = writeln!(
                out,
                "  {:<24} {:>12} {:>12} {:>12}",
                "category", "live", "at peak", "own peak"
            );
            for c in Category::ALL {
                let peak = Some(d.peak.get(c));
                row(
                    &mut out,
                    c.label(),
                    d.live.get(c),
                    d.at_peak.bytes.get(c),
                    peak,
                );
            }
            row(&mut out, "total", d.live_total, d.peak_total, None);
            let _ = writeln!(
                out,
                "  peak reached in {}; all gradients together peaked at {}",
                d.at_peak.describe(),
                human_bytes(d.gradients_peak)
            );
            if !d.saved_by_layer.is_empty() {
                let _ = writeln!(out, "  saved for backward, by layer (top 10 by peak):");
                for l in d.saved_by_layer.iter().take(10) {
                    let _ = writeln!(
                        out,
                        "    {:<30} live {:>12}  peak {:>12}",
                        l.layer,
                        human_bytes(l.live),
                        human_bytes(l.peak)
                    );
                }
            }
        }
        out
    }
}
