//! The lean-next-to-save-all table and JSON of a [`MemoryPlan`].

use super::{MemoryPlan, StepInput};
use crate::memory::{human_bytes, Category, LayerBytes};
use crate::Device;
use std::fmt::Write;

fn ratio(lean: usize, all: usize) -> String {
    if lean == 0 {
        if all == 0 {
            "—".into()
        } else {
            "∞".into()
        }
    } else {
        format!("{:.2}×", all as f64 / lean as f64)
    }
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
    out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

impl MemoryPlan {
    /// The plan as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A table: peak bytes by category (lean, save-all, ratio) and the
    /// `top` layers with the most saved bytes under the lean policy.
    pub fn to_table(&self, top: usize) -> String {
        let s = &self.spec;
        let (l, a) = (&self.lean.report, &self.save_all.report);
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
            "{:<18} {:>24} {:>24} {:>9}",
            "peak", "lean", "save-all", "save/lean"
        );
        let rows = [
            ("parameters", Category::Parameter),
            ("gradients", Category::Gradient),
            ("saved", Category::Saved),
            ("optimizer state", Category::OptimizerState),
            ("workspace", Category::Workspace),
            ("other", Category::Other),
        ];
        for (name, c) in rows {
            let (x, y) = (l.peak.get(c), a.peak.get(c));
            let _ = writeln!(
                out,
                "{name:<18} {:>24} {:>24} {:>9}",
                human_bytes(x),
                human_bytes(y),
                ratio(x, y)
            );
        }
        let _ = writeln!(
            out,
            "{:<18} {:>24} {:>24} {:>9}",
            "total",
            human_bytes(l.peak_total),
            human_bytes(a.peak_total),
            ratio(l.peak_total, a.peak_total)
        );
        let _ = writeln!(
            out,
            "{:<18} {:>24} {:>24} {:>9}",
            "leaf gradients",
            human_bytes(l.parameter_gradient_peak),
            human_bytes(a.parameter_gradient_peak),
            ratio(l.parameter_gradient_peak, a.parameter_gradient_peak)
        );
        if top > 0 {
            let (lean, all) = (by_layer(&l.saved_by_layer), by_layer(&a.saved_by_layer));
            let _ = writeln!(out, "layers with the most saved bytes (peak, lean):");
            for (layer, bytes) in lean.iter().take(top) {
                let other = all.iter().find(|(n, _)| n == layer).map_or(0, |(_, b)| *b);
                let _ = writeln!(
                    out,
                    "  {layer:<24} {:>24} {:>24} {:>9}",
                    human_bytes(*bytes),
                    human_bytes(other),
                    ratio(*bytes, other)
                );
            }
            if lean.is_empty() {
                let _ = writeln!(out, "  (nothing saved)");
            }
        }
        out
    }
}
