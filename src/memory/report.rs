//! Ledger snapshots, printable as a table or serialisable as JSON.

use super::Category;
use serde::Serialize;
use std::fmt::Write;

/// Bytes in each category.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CategoryBytes {
    /// [`Category::Parameter`]: model weights and buffers.
    pub parameter: usize,
    /// [`Category::Gradient`]: gradient buffers.
    pub gradient: usize,
    /// [`Category::Saved`]: tensors held for backward.
    pub saved: usize,
    /// [`Category::OptimizerState`]: moments and momentum buffers.
    pub optimizer_state: usize,
    /// [`Category::Workspace`]: temporaries of running ops.
    pub workspace: usize,
    /// [`Category::Other`]: inputs, activations, results.
    pub other: usize,
}

impl CategoryBytes {
    pub(crate) fn from_array(a: [usize; 6]) -> Self {
        CategoryBytes {
            parameter: a[0],
            gradient: a[1],
            saved: a[2],
            optimizer_state: a[3],
            workspace: a[4],
            other: a[5],
        }
    }

    /// The bytes in one category.
    pub fn get(&self, category: Category) -> usize {
        match category {
            Category::Parameter => self.parameter,
            Category::Gradient => self.gradient,
            Category::Saved => self.saved,
            Category::OptimizerState => self.optimizer_state,
            Category::Workspace => self.workspace,
            Category::Other => self.other,
        }
    }
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
    /// Bytes live now, per category.
    pub live: CategoryBytes,
    /// Each category's own peak (they need not coincide, so they may sum
    /// to more than `peak_total`).
    pub peak: CategoryBytes,
    /// Gradient bytes that have reached a parameter (part of `gradient`).
    pub parameter_gradient_live: usize,
    /// Peak of `parameter_gradient_live`.
    pub parameter_gradient_peak: usize,
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

impl MemoryReport {
    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as a text table: one block per device, categories as rows,
    /// then the layers holding the most saved bytes.
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
            let _ = writeln!(out, "  {:<16} {:>14} {:>14}", "category", "live", "peak");
            for c in Category::ALL {
                let _ = writeln!(
                    out,
                    "  {:<16} {:>14} {:>14}",
                    c.name(),
                    human_bytes(d.live.get(c)),
                    human_bytes(d.peak.get(c))
                );
                if c == Category::Gradient {
                    let _ = writeln!(
                        out,
                        "  {:<16} {:>14} {:>14}",
                        "  of parameters",
                        human_bytes(d.parameter_gradient_live),
                        human_bytes(d.parameter_gradient_peak)
                    );
                }
            }
            let _ = writeln!(
                out,
                "  {:<16} {:>14} {:>14}",
                "total",
                human_bytes(d.live_total),
                human_bytes(d.peak_total)
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
