//! The table and JSON of a [`MemoryPlan`]: the lean policy next to what
//! PyTorch's autograd keeps.

use super::{MemoryPlan, StepInput};
use crate::memory::{human_bytes, Category, CategoryBytes, DeviceReport, LayerBytes};
use crate::Device;
use serde::Serialize;
use std::fmt::Write;

/// One layer's saved-for-backward bytes under both policies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerComparison {
    /// The layer path (`(top)` for ops outside any layer).
    pub layer: String,
    /// Under the lean policy: each of the layer's ops' peak saved bytes, summed.
    pub lean: usize,
    /// The same under what PyTorch's autograd keeps.
    pub pytorch: usize,
    /// `pytorch − lean` (negative if lean keeps more).
    pub difference: i64,
}

/// Saved bytes of the layer part of a `layer/op` label, summed over ops.
fn by_layer(rows: &[LayerBytes]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for r in rows {
        let layer = r.layer.split('/').next().unwrap_or_default();
        let layer = if layer.is_empty() { "(top)" } else { layer };
        match out.iter_mut().find(|(l, _)| l == layer) {
            Some((_, b)) => *b += r.peak,
            None => out.push((layer.to_string(), r.peak)),
        }
    }
    out
}

/// Every layer that saved something under either policy, largest
/// difference (`pytorch − lean`) first, then by name.
pub(super) fn compare_layers(lean: &DeviceReport, pytorch: &DeviceReport) -> Vec<LayerComparison> {
    let (lean, pytorch) = (
        by_layer(&lean.saved_by_layer),
        by_layer(&pytorch.saved_by_layer),
    );
    let mut names: Vec<&String> = lean.iter().chain(&pytorch).map(|(n, _)| n).collect();
    names.sort();
    names.dedup();
    let bytes = |rows: &[(String, usize)], name: &str| {
        rows.iter().find(|(n, _)| n == name).map_or(0, |(_, b)| *b)
    };
    let mut out: Vec<LayerComparison> = names
        .into_iter()
        .map(|name| {
            let (l, p) = (bytes(&lean, name), bytes(&pytorch, name));
            LayerComparison {
                layer: name.clone(),
                lean: l,
                pytorch: p,
                difference: p as i64 - l as i64,
            }
        })
        .collect();
    out.sort_by(|a, b| b.difference.cmp(&a.difference).then(a.layer.cmp(&b.layer)));
    out
}

fn ratio(lean: usize, pytorch: usize) -> String {
    if lean == 0 {
        if pytorch == 0 {
            "—".into()
        } else {
            "∞".into()
        }
    } else {
        format!("{:.2}×", pytorch as f64 / lean as f64)
    }
}

fn signed_bytes(b: i64) -> String {
    let size = human_bytes(b.unsigned_abs() as usize);
    match b {
        0 => size,
        b if b > 0 => format!("+{size}"),
        _ => format!("−{size}"),
    }
}

/// Writes one row: a name, then right-aligned columns.
fn row(out: &mut String, width: usize, name: &str, cells: [String; 3]) {
    let [a, b, c] = cells;
    let _ = writeln!(out, "  {name:<width$} {a:>12} {b:>12} {c:>14}");
}

/// Category rows (and their sum, `total`) of `lean` next to `pytorch`.
fn category_rows(out: &mut String, width: usize, lean: &CategoryBytes, pytorch: &CategoryBytes) {
    for c in Category::ALL {
        let (l, p) = (lean.get(c), pytorch.get(c));
        row(
            out,
            width,
            c.label(),
            [human_bytes(l), human_bytes(p), ratio(l, p)],
        );
    }
}

impl MemoryPlan {
    /// The plan as pretty-printed JSON: `model`, `spec`, then `lean` and
    /// `pytorch` (each a `report`: the ledger of the step's device), the
    /// `layers` comparison and `seconds`.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The text report: the breakdown at the moment of each policy's peak
    /// (rows adding up to the peak) and what was running then, each
    /// category's own peak, and the `top` layers by how much more PyTorch's
    /// autograd saves than the lean policy.
    pub fn to_table(&self, top: usize) -> String {
        let s = &self.spec;
        let (l, p) = (&self.lean.report, &self.pytorch.report);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: batch {}, {}, {}, case {}, {}{}, {} (both policies in {:.1} ms)",
            self.model,
            s.batch,
            match s.input {
                StepInput::Image { size, .. } => format!("{size}×{size}"),
                StepInput::Tokens { seq, .. } => format!("{seq} tokens"),
            },
            format!("{:?}", s.dtype).to_lowercase(),
            s.case,
            s.optimizer.name(),
            if s.fused { " fused" } else { "" },
            if s.device == Device::Meta {
                "predicted on meta".to_string()
            } else {
                format!("measured on {}", s.device)
            },
            self.seconds * 1e3
        );
        let _ = writeln!(
            out,
            "lean: what leangrad keeps; pytorch: what PyTorch's autograd keeps for the same step"
        );
        let shown = self.layers.iter().take(top);
        let width = shown
            .clone()
            .map(|r| r.layer.chars().count())
            .chain([24])
            .max()
            .unwrap_or(24);
        let header = |out: &mut String, title: &str, last: &str| {
            let _ = writeln!(out, "\n{title}");
            row(
                out,
                width,
                "",
                ["lean".into(), "pytorch".into(), last.into()],
            );
        };

        header(&mut out, "at the moment of the peak", "pytorch/lean");
        category_rows(&mut out, width, &l.at_peak.bytes, &p.at_peak.bytes);
        row(
            &mut out,
            width,
            "total (the peak)",
            [
                human_bytes(l.peak_total),
                human_bytes(p.peak_total),
                ratio(l.peak_total, p.peak_total),
            ],
        );
        for (name, r) in [("lean", l), ("pytorch", p)] {
            let _ = writeln!(
                out,
                "  {name} peak reached in {}, at allocation {} of {}",
                r.at_peak.describe(),
                r.at_peak.allocation,
                r.allocations
            );
        }

        header(&mut out, "each category's own peak", "pytorch/lean");
        category_rows(&mut out, width, &l.peak, &p.peak);
        row(
            &mut out,
            width,
            "all gradients at once",
            [
                human_bytes(l.gradients_peak),
                human_bytes(p.gradients_peak),
                ratio(l.gradients_peak, p.gradients_peak),
            ],
        );

        if top > 0 {
            header(
                &mut out,
                "saved for backward, by layer (each op's peak, summed), largest difference first",
                "difference",
            );
            for r in shown {
                row(
                    &mut out,
                    width,
                    &r.layer,
                    [
                        human_bytes(r.lean),
                        human_bytes(r.pytorch),
                        signed_bytes(r.difference),
                    ],
                );
            }
            if self.layers.is_empty() {
                let _ = writeln!(out, "  (nothing saved)");
            }
        }
        out
    }
}
