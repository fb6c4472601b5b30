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

/// What PyTorch itself measured for the same step (run by `leangrad
/// memory --compare-torch` with `python-compare/torch_step_memory.py`):
/// the extra column of [`MemoryPlan::to_table_compared`]. `None` is a
/// number PyTorch does not give for this step (shown as `—`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TorchMeasured {
    /// Where the numbers come from, for the table's legend (`torch
    /// 2.15.0, torchvision 0.29.2, on meta`).
    pub source: String,
    /// The device PyTorch ran the step on (`meta`, `cpu`, `cuda`): what
    /// it could measure there is said under the table.
    pub device: String,
    /// The batch PyTorch ran.
    pub batch: usize,
    /// The model's parameters and buffers.
    pub parameters: Option<usize>,
    /// The optimizer's state after the step.
    pub optimizer_state: Option<usize>,
    /// The peak of what autograd saved for backward.
    pub saved: Option<usize>,
    /// The step's peak, parameters included.
    pub peak_total: Option<usize>,
}

/// Writes one row: a name, then right-aligned columns (the last one wider).
fn row(out: &mut String, width: usize, name: &str, cells: &[String]) {
    let _ = write!(out, "  {name:<width$}");
    for (i, cell) in cells.iter().enumerate() {
        let w = if i + 1 == cells.len() { 14 } else { 12 };
        let _ = write!(out, " {cell:>w$}");
    }
    out.push('\n');
}

/// The cells of one row: lean, pytorch, PyTorch's measurement when there
/// is a torch column (`—` without a number), then the last cell.
fn cells(lean: String, pytorch: String, torch: Option<Option<usize>>, last: String) -> Vec<String> {
    let mut v = vec![lean, pytorch];
    if let Some(measured) = torch {
        v.push(measured.map_or_else(|| "—".to_string(), human_bytes));
    }
    v.push(last);
    v
}

/// The torch column's number for each category, when there is one.
type TorchCells<'a> = Option<&'a dyn Fn(Category) -> Option<usize>>;

/// Category rows of `lean` next to `pytorch`, with `torch`'s number for
/// each category when there is a torch column.
fn category_rows(
    out: &mut String,
    width: usize,
    lean: &CategoryBytes,
    pytorch: &CategoryBytes,
    torch: TorchCells,
) {
    for c in Category::ALL {
        let (l, p) = (lean.get(c), pytorch.get(c));
        let cells = cells(
            human_bytes(l),
            human_bytes(p),
            torch.map(|t| t(c)),
            ratio(l, p),
        );
        row(out, width, c.label(), &cells);
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
        self.to_table_compared(top, None)
    }

    /// [`MemoryPlan::to_table`] with, when `torch` is given, a column of
    /// what PyTorch itself measured for the same step (between `pytorch`
    /// and the ratio): the step's peak, and the own peaks of parameters,
    /// optimizer state and saved for backward; `—` in every other row.
    pub fn to_table_compared(&self, top: usize, torch: Option<&TorchMeasured>) -> String {
        let s = &self.spec;
        let (l, p) = (&self.lean.report, &self.pytorch.report);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: batch {}, {}, {}, case {}, {}{}{}, {} (both policies in {:.1} ms)",
            self.model,
            s.batch,
            match s.input {
                StepInput::Image { size, .. } => format!("{size}×{size}"),
                StepInput::Tokens { seq, .. } => format!("{seq} tokens"),
            },
            match s.autocast {
                Some(low) => format!("{:?} under {:?} autocast", s.dtype, low).to_lowercase(),
                None => format!("{:?}", s.dtype).to_lowercase(),
            },
            s.case,
            optimizer_label(s.optimizer),
            if s.fused { " fused" } else { "" },
            if s.checkpoint {
                ", every block checkpointed"
            } else {
                ""
            },
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
        if let Some(t) = torch {
            let _ = writeln!(
                out,
                "torch: measured in PyTorch itself ({}); — where it gives no such number",
                t.source
            );
        }
        let shown = self.layers.iter().take(top);
        let width = shown
            .clone()
            .map(|r| r.layer.chars().count())
            .chain([24])
            .max()
            .unwrap_or(24);
        let header = |out: &mut String, title: &str, last: &str| {
            let _ = writeln!(out, "\n{title}");
            let mut head = vec!["lean".to_string(), "pytorch".into(), last.into()];
            if torch.is_some() {
                head.insert(2, "torch".into());
            }
            row(out, width, "", &head);
        };
        // The torch cell of a row: Some(number or None) with a torch column.
        let cell = |pick: fn(&TorchMeasured) -> Option<usize>| torch.map(pick);
        let unmeasured = |_: Category| None;
        let own_peak = |c: Category| {
            torch.and_then(|t| match c {
                Category::Parameter => t.parameters,
                Category::OptimizerState => t.optimizer_state,
                Category::Saved => t.saved,
                _ => None,
            })
        };
        let (at_peak_torch, own_peak_torch): (TorchCells, TorchCells) = match torch {
            Some(_) => (Some(&unmeasured), Some(&own_peak)),
            None => (None, None),
        };

        header(&mut out, "at the moment of the peak", "pytorch/lean");
        category_rows(
            &mut out,
            width,
            &l.at_peak.bytes,
            &p.at_peak.bytes,
            at_peak_torch,
        );
        row(
            &mut out,
            width,
            "total (the peak)",
            &cells(
                human_bytes(l.peak_total),
                human_bytes(p.peak_total),
                cell(|t| t.peak_total),
                ratio(l.peak_total, p.peak_total),
            ),
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
        category_rows(&mut out, width, &l.peak, &p.peak, own_peak_torch);
        row(
            &mut out,
            width,
            "all gradients at once",
            &cells(
                human_bytes(l.gradients_peak),
                human_bytes(p.gradients_peak),
                cell(|_| None),
                ratio(l.gradients_peak, p.gradients_peak),
            ),
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
                    &cells(
                        human_bytes(r.lean),
                        human_bytes(r.pytorch),
                        cell(|_| None),
                        signed_bytes(r.difference),
                    ),
                );
            }
            if self.layers.is_empty() {
                let _ = writeln!(out, "  (nothing saved)");
            }
        }
        if let Some(t) = torch {
            out.push('\n');
            out += &wrap(&t.what_it_measures(), 100);
        }
        out
    }
}

/// `text` broken into lines of at most `width` characters at spaces
/// (a longer word keeps its own line), each ending in a newline.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out += &line;
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line += word;
    }
    if !line.is_empty() {
        out += &line;
        out.push('\n');
    }
    out
}

/// The optimizer's usual name, for people (`SGD`, `Adam`, `AdamW`).
pub(super) fn optimizer_label(kind: super::OptimizerKind) -> &'static str {
    match kind {
        super::OptimizerKind::Sgd => "SGD",
        super::OptimizerKind::Adam => "Adam",
        super::OptimizerKind::Adamw => "AdamW",
    }
}

impl TorchMeasured {
    /// What PyTorch's run on its device can and cannot measure, for people
    /// (said under the table).
    pub fn what_it_measures(&self) -> String {
        let b = self.batch;
        match self.device.as_str() {
            "meta" => format!(
                "torch on meta (batch {b}): PyTorch's meta device allocates nothing, so it measures only \
                 the parameters and buffers and the bytes autograd saves for backward; the step's peak, \
                 activations, gradients, workspace and optimizer state need a real run: \
                 `--compare-torch cpu` runs the step on the CPU (at --torch-batch, default 2) and \
                 measures its peak too"
            ),
            "cpu" => format!(
                "torch on cpu (batch {b}): the step's peak is the bytes of the storages the step starts \
                 with (parameters, buffers, input, targets) plus the peak of the CPU allocator's events \
                 during the step (PyTorch's profiler); with the parameters, the optimizer state and the \
                 bytes autograd saves, that is what it measures: it does not split the peak into \
                 categories"
            ),
            other => format!(
                "torch on {other} (batch {b}): the step's peak is torch.cuda.max_memory_allocated(); \
                 with the parameters, the optimizer state and the bytes autograd saves, that is what it \
                 measures: it does not split the peak into categories"
            ),
        }
    }
}
