//! `leangrad memory --compare-torch`: the same step measured in PyTorch
//! itself, by `python-compare/torch_step_memory.py`.
//!
//! The interpreter is `LEANGRAD_PYTHON` when set (a program name or path),
//! else `python3`. The script is the copy of `python-compare/
//! torch_step_memory.py` built into this binary (so an installed or
//! copied `leangrad` needs no checkout), written to a temporary file for
//! the run; `LEANGRAD_TORCH_SCRIPT` names another file to run instead.
//! The script prints one JSON object (its docstring lists the fields).
//!
//! Outcomes: the numbers ([`Outcome::Measured`]); or, when the
//! interpreter is not there or lacks `torch` / `torchvision` /
//! `transformers` ([`Outcome::Unavailable`]), the exact `pip install`
//! line, which the command prints on stderr next to its own table (exit
//! status 0); a script that fails otherwise is an error naming it, with
//! the end of its stderr.

use crate::args::{MemoryArgs, SAME_DEVICE};
use anyhow::{bail, Context, Result};
use leangrad::memory_plan::{StepInput, StepSpec, TorchMeasured};
use leangrad::optim::StateFormat;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

/// The script, as built into the binary.
const SCRIPT: &str = include_str!("../../../python-compare/torch_step_memory.py");
/// Its name in the repository, for messages.
pub const SCRIPT_NAME: &str = "python-compare/torch_step_memory.py";
/// The script's exit status when a module the model needs is missing.
const EXIT_MISSING: i32 = 3;
/// Lines of the script's stderr quoted when it fails.
const STDERR_TAIL_LINES: usize = 20;

/// PyTorch's batch for `--compare-torch cpu` without `--torch-batch`: a
/// real step on the CPU, small enough to take seconds.
pub const DEFAULT_CPU_BATCH: usize = 2;

/// Where and at which batch PyTorch runs the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchRun {
    /// `meta`, `cpu` or `cuda`, as the script's `--device`.
    pub device: String,
    /// Samples per batch.
    pub batch: usize,
}

impl TorchRun {
    /// The run `--compare-torch [DEVICE]` and `--torch-batch` ask for;
    /// `None` without `--compare-torch`. Alone, it is the step's own
    /// device and batch; `cpu` defaults to [`DEFAULT_CPU_BATCH`] (at
    /// most `--batch`).
    pub fn asked(a: &MemoryArgs) -> Option<TorchRun> {
        let choice = a.compare_torch.as_deref()?;
        let device = if choice == SAME_DEVICE {
            a.device.clone()
        } else {
            choice.to_string()
        };
        let batch = match a.torch_batch {
            Some(b) => b as usize,
            None if choice == "cpu" => DEFAULT_CPU_BATCH.min(a.batch as usize),
            None => a.batch as usize,
        };
        Some(TorchRun { device, batch })
    }
}

/// What `--compare-torch` found.
pub enum Outcome {
    /// PyTorch ran the step: the script's JSON object and the table's column.
    Measured(Value, TorchMeasured),
    /// PyTorch could not run it: the JSON to report (`missing`, `install`)
    /// and the message for stderr.
    Unavailable(Value, String),
}

/// The interpreter to run: `LEANGRAD_PYTHON`, else `python3`.
fn python() -> String {
    std::env::var("LEANGRAD_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// The companion package of `model`: torchvision for the CNNs,
/// transformers for the Hugging Face models.
fn companion(model: &str) -> &'static str {
    match model {
        "vit_b16" | "bert_base" | "roberta_base" | "xlm_roberta_base" | "gpt2" | "mistral_7b" => {
            "transformers"
        }
        _ => "torchvision",
    }
}

/// The script's arguments for the step `spec` of `a.model`, run as `run`
/// says (its device and batch).
pub fn script_args(a: &MemoryArgs, spec: &StepSpec, run: &TorchRun) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "--model".into(),
        a.model.clone(),
        "--batch".into(),
        run.batch.to_string(),
        "--case".into(),
        spec.case.to_string(),
        "--classes".into(),
        spec.classes.to_string(),
        "--dtype".into(),
        a.dtype.clone(),
        "--optimizer".into(),
        spec.optimizer.name().into(),
        "--device".into(),
        run.device.clone(),
    ];
    match spec.input {
        StepInput::Image { size, .. } => v.extend(["--size".into(), size.to_string()]),
        StepInput::Tokens { seq, .. } => v.extend(["--seq".into(), seq.to_string()]),
    }
    if spec.fused {
        v.push("--fused".into());
    }
    if spec.checkpoint {
        v.push("--checkpoint".into());
    }
    if spec.optimizer_state != StateFormat::Full {
        v.extend(["--optimizer-state".into(), spec.optimizer_state.to_string()]);
    }
    if let Some(d) = spec.autocast {
        v.extend(["--autocast".into(), format!("{d:?}").to_lowercase()]);
    }
    v
}

/// The script file to run and whether it is a temporary copy to remove.
fn script_file() -> Result<(PathBuf, bool)> {
    if let Some(path) = std::env::var_os("LEANGRAD_TORCH_SCRIPT").filter(|p| !p.is_empty()) {
        return Ok((PathBuf::from(path), false));
    }
    let path = std::env::temp_dir().join(format!(
        "leangrad-torch_step_memory-{}.py",
        std::process::id()
    ));
    std::fs::write(&path, SCRIPT)
        .with_context(|| format!("writing {SCRIPT_NAME} to {}", path.display()))?;
    Ok((path, true))
}

/// The install hint for the `missing` modules; `found`: whether the
/// interpreter itself is there.
fn unavailable(python: &str, why: &str, missing: &[String], found: bool) -> Outcome {
    let install = format!("pip install {}", missing.join(" "));
    let into = if found {
        "Install what is missing into that Python"
    } else {
        "Install Python 3, then"
    };
    let message = format!(
        "--compare-torch: {why}, so the torch column is left out.\n\
         {into}:\n    {install}\n\
         or set LEANGRAD_PYTHON to a Python that has it (now `{python}`).\n"
    );
    let report = json!({ "missing": missing, "install": install });
    Outcome::Unavailable(report, message)
}

/// The modules a Python traceback says it could not import (`No module
/// named 'torch'`), top-level names only.
fn modules_not_found(stderr: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for piece in stderr.split("No module named '").skip(1) {
        let name = piece.split(['\'', '.']).next().unwrap_or_default();
        if !name.is_empty() && !out.iter().any(|m| m == name) {
            out.push(name.to_string());
        }
    }
    out
}

/// The last lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs the script for `a.model` with `args` (made by [`script_args`] for
/// `run`) and reads its answer.
pub fn measure(a: &MemoryArgs, args: &[String], run: &TorchRun) -> Result<Outcome> {
    let python = python();
    let (script, temporary) = script_file()?;
    let output = Command::new(&python).arg(&script).args(args).output();
    if temporary {
        let _ = std::fs::remove_file(&script);
    }
    let needs = ["torch".to_string(), companion(&a.model).to_string()];
    let output = match output {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let why = format!("there is no Python `{python}` to run PyTorch");
            return Ok(unavailable(&python, &why, &needs, false));
        }
        Err(e) => bail!("could not run `{python}` for {SCRIPT_NAME}: {e}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(EXIT_MISSING) {
        if let Ok(v) = serde_json::from_str::<Value>(stdout.trim()) {
            let missing: Vec<String> = v["missing"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            if !missing.is_empty() {
                let why = format!("`{python}` cannot import {}", missing.join(", "));
                return Ok(unavailable(&python, &why, &missing, true));
            }
            if let Some(why) = v["unsupported"].as_str() {
                let message = format!("--compare-torch: {why}, so the torch column is left out.\n");
                return Ok(Outcome::Unavailable(v.clone(), message));
            }
        }
    }
    if !output.status.success() {
        // A Python that lacks torch failing at the import (an older copy
        // of the script, or a site-less interpreter) says so in a traceback.
        let missing = modules_not_found(&stderr);
        if !missing.is_empty() && missing.iter().all(|m| needs.contains(m)) {
            let missing = if missing.iter().any(|m| m == "torch") {
                needs.to_vec()
            } else {
                missing
            };
            let why = format!("`{python}` cannot import {}", missing.join(", "));
            return Ok(unavailable(&python, &why, &missing, true));
        }
        bail!(
            "{SCRIPT_NAME} (run by `{python}`) failed ({}):\n{}",
            output.status,
            tail(&stderr, STDERR_TAIL_LINES)
        );
    }
    let first = stdout.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let v: Value = serde_json::from_str(first).with_context(|| {
        format!(
            "{SCRIPT_NAME} (run by `{python}`) printed no JSON object: {:?}\n{}",
            tail(&stdout, 3),
            tail(&stderr, STDERR_TAIL_LINES)
        )
    })?;
    let column = column(&v, a, args, run)?;
    Ok(Outcome::Measured(v, column))
}

/// The table's column from the script's object, after checking that it
/// describes the step asked for.
fn column(v: &Value, a: &MemoryArgs, args: &[String], run: &TorchRun) -> Result<TorchMeasured> {
    let asked = |flag: &str| {
        args.iter()
            .position(|x| x == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let answered = |key: &str| match &v[key] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    for key in ["model", "batch", "case", "device"] {
        let (want, got) = (asked(&format!("--{key}")), answered(key));
        if got != want {
            let show = |s: Option<String>| s.unwrap_or_else(|| "(none)".into());
            bail!(
                "{SCRIPT_NAME} measured {key} {}, not the {} asked for",
                show(got),
                show(want)
            );
        }
    }
    let bytes = |key: &str| -> Result<Option<usize>> {
        match &v[key] {
            Value::Null => Ok(None),
            Value::Number(n) => n
                .as_u64()
                .map(|b| Some(b as usize))
                .with_context(|| format!("{SCRIPT_NAME}: `{key}` is not a byte count: {n}")),
            other => bail!("{SCRIPT_NAME}: `{key}` is not a byte count: {other}"),
        }
    };
    let saved = bytes("saved_bytes")?;
    if saved.is_none() {
        bail!("{SCRIPT_NAME} gave no `saved_bytes` for {}", a.model);
    }
    let versions = ["torch", companion(&a.model)]
        .iter()
        .filter_map(|m| v["versions"][m].as_str().map(|ver| format!("{m} {ver}")))
        .collect::<Vec<_>>();
    let mut source = versions.join(", ");
    if let Some(attention) = v["attention"].as_str() {
        source += &format!(", {attention} attention");
    }
    source += &format!(", on {}", run.device);
    Ok(TorchMeasured {
        source,
        device: run.device.clone(),
        batch: run.batch,
        parameters: bytes("parameter_bytes")?,
        optimizer_state: bytes("optimizer_state_bytes")?,
        saved,
        peak_total: bytes("step_peak_bytes")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_come_from_the_traceback() {
        let stderr = "Traceback (most recent call last):\n  File \"x.py\", line 3\n\
                      ModuleNotFoundError: No module named 'torch.nn'\n";
        assert_eq!(modules_not_found(stderr), ["torch"]);
        assert!(modules_not_found("ValueError: bad").is_empty());
    }
}
