//! Training checkpoints: the model's weights, the optimizer's state and the
//! schedule's position, saved together so that a resumed run continues bit
//! for bit.
//!
//! A checkpoint is a folder of three files:
//!
//! - `model.safetensors`: the model's state dict with its PyTorch names
//!   (`safetensors.torch.load_file` + `model.load_state_dict` read it);
//! - `optimizer.safetensors`: the optimizer's tensors, `state.{id}.{name}`
//!   (`state.0.exp_avg`, `state.3.momentum_buffer`), `accumulated.{id}`
//!   (accumulation buffers between micro-batches) and `grad.{id}` (pending
//!   `.grad`s, when captured), `id` being PyTorch's parameter id;
//! - `checkpoint.json`: the format version, the optimizer's kind, each
//!   group's hyper-parameters with its parameter ids and names (PyTorch's
//!   `param_groups`), each parameter's step count, the accumulation window,
//!   clipping, the schedule's position, the training progress (epoch, step)
//!   and free-form user metadata.
//!
//! [`Checkpoint::save`] writes a new folder beside the old one and swaps it
//! in by renaming, so a crash mid-save never leaves a damaged checkpoint:
//! either the previous one or the new one is whole (if a crash falls between
//! the two renames, [`Checkpoint::load`] finds the previous one).

use super::{load_into, load_safetensors, serialize_safetensors, LoadOptions, LoadReport};
use crate::optim::{
    CheckpointHyper, Clip, GroupState, Optimizer, OptimizerState, SavedParamState, ScheduleState,
    Scheduler,
};
use crate::{Error, Result, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The version written in `checkpoint.json`; newer versions are refused.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT: &str = "leangrad-checkpoint";
/// The model's weights inside a checkpoint folder.
pub const MODEL_FILE: &str = "model.safetensors";
/// The optimizer's tensors inside a checkpoint folder.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Everything else, as JSON, inside a checkpoint folder.
pub const MANIFEST_FILE: &str = "checkpoint.json";

/// Where training was when the checkpoint was taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The epoch.
    pub epoch: u64,
    /// The step (however the training loop counts them).
    pub step: u64,
}

/// A whole training state: model weights, optimizer state, schedule
/// position, progress and user metadata. See the module documentation for
/// the files.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The model's state dict.
    pub model: BTreeMap<String, Tensor>,
    /// The optimizer's state.
    pub optimizer: OptimizerState,
    /// The schedule's position, if a schedule was given.
    pub schedule: Option<ScheduleState>,
    /// The training progress.
    pub progress: Progress,
    /// Free-form user metadata.
    pub metadata: Map<String, Value>,
}

fn fault(entry: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Checkpoint {
        entry: entry.into(),
        reason: reason.into(),
    }
}

fn path_fault(path: &Path, reason: impl Into<String>) -> Error {
    fault(path.display().to_string(), reason)
}

impl Checkpoint {
    /// The current state of a training run. `model` is the model's state
    /// dict ([`crate::io::state_dict`] or [`crate::io::state_dict_of`]); the
    /// optimizer's parameters are named by the entries of `model` that are
    /// the same tensors.
    pub fn capture<A: CheckpointHyper>(
        model: &[(String, Tensor)],
        optimizer: &Optimizer<A>,
        schedule: Option<&dyn Scheduler>,
    ) -> Result<Checkpoint> {
        let mut weights = BTreeMap::new();
        for (name, t) in model {
            if weights.insert(name.clone(), t.clone()).is_some() {
                return Err(fault(
                    format!("model.{name}"),
                    "the name appears twice in the state dict",
                ));
            }
        }
        Ok(Checkpoint {
            model: weights,
            optimizer: optimizer.state_dict_named(model)?,
            schedule: schedule.map(|s| s.state()),
            progress: Progress::default(),
            metadata: Map::new(),
        })
    }

    /// Also captures the optimizer's pending `.grad`s (the usual path's
    /// gradients accumulated over `backward()` calls before `step()`), so a
    /// checkpoint taken between micro-batches resumes exactly; restoring
    /// replaces every owned parameter's `.grad`.
    pub fn with_pending_grads<A: CheckpointHyper>(mut self, optimizer: &Optimizer<A>) -> Self {
        self.optimizer.grads = Some(optimizer.pending_grads());
        self
    }

    /// Records the training progress.
    pub fn with_progress(mut self, epoch: u64, step: u64) -> Self {
        self.progress = Progress { epoch, step };
        self
    }

    /// Adds a user metadata entry.
    pub fn with_metadata(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.metadata.insert(key.to_string(), value.into());
        self
    }

    /// Writes the checkpoint folder `dir` atomically: into `dir.partial`
    /// first (each file synced), then the previous `dir` (if any) is renamed
    /// to `dir.previous`, `dir.partial` to `dir`, and `dir.previous` removed.
    ///
    /// Only what leangrad wrote is ever moved or removed: `dir` must be new,
    /// an empty folder, or a leangrad checkpoint (its `checkpoint.json` says
    /// so and it holds nothing but checkpoint files), and `dir.partial` and
    /// `dir.previous`, when present, must hold nothing but checkpoint files
    /// (what an interrupted save leaves); see [`Checkpoint::check_destination`].
    /// Anything else is [`Error::Checkpoint`] naming it, and nothing is
    /// touched.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        Self::check_destination(dir)?;
        let (partial, previous) = siblings(dir)?;
        let manifest = serde_json::to_vec_pretty(&self.manifest()?)
            .map_err(|e| path_fault(&dir.join(MANIFEST_FILE), e.to_string()))?;
        let model: Vec<(String, Tensor)> = self
            .model
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let model = serialize_safetensors(&model)?;
        let optimizer = serialize_safetensors(&optimizer_tensors(&self.optimizer))?;

        remove_checkpoint_folder(&partial)?;
        std::fs::create_dir_all(&partial).map_err(|e| io_fault(&partial, e))?;
        for (name, bytes) in [
            (MODEL_FILE, &model),
            (OPTIMIZER_FILE, &optimizer),
            (MANIFEST_FILE, &manifest),
        ] {
            let path = partial.join(name);
            let mut f = File::create(&path).map_err(|e| io_fault(&path, e))?;
            f.write_all(bytes).map_err(|e| io_fault(&path, e))?;
            f.sync_all().map_err(|e| io_fault(&path, e))?;
        }
        sync_dir(&partial);
        // `dir` only ever appears by renaming a complete folder (or was an
        // empty one), so when it exists an old `previous` can go; when it
        // does not, `previous` may be the only whole checkpoint and stays
        // until the new one is in place.
        if dir.exists() {
            remove_checkpoint_folder(&previous)?;
            std::fs::rename(dir, &previous).map_err(|e| io_fault(dir, e))?;
        }
        std::fs::rename(&partial, dir).map_err(|e| io_fault(dir, e))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent);
        }
        remove_checkpoint_folder(&previous)
    }

    /// Checks, touching nothing, that [`Checkpoint::save`] may write `dir`:
    /// it does not exist, or is an empty folder, or holds a leangrad
    /// checkpoint and nothing else; and its `.partial` and `.previous`
    /// siblings are absent or hold only checkpoint files. A job calls this
    /// before it starts, so that a wrong `--out` is refused at once rather
    /// than after the first epoch.
    pub fn check_destination(dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let (partial, previous) = siblings(dir)?;
        match folder_contents(dir)? {
            None => {}
            Some(names) if names.is_empty() => {}
            Some(names) => {
                only_checkpoint_files(dir, &names)?;
                if !names.iter().any(|n| n == MANIFEST_FILE) || !is_leangrad_manifest(dir) {
                    return Err(path_fault(
                        dir,
                        format!(
                            "exists and is not a leangrad checkpoint (no {MANIFEST_FILE} of leangrad's in it); \
                             leangrad writes checkpoints only into a new or empty folder or over its own \
                             checkpoint: choose another folder"
                        ),
                    ));
                }
            }
        }
        for sibling in [&partial, &previous] {
            if let Some(names) = folder_contents(sibling)? {
                only_checkpoint_files(sibling, &names)?;
            }
        }
        Ok(())
    }

    /// Reads the checkpoint folder `dir` (or `dir.previous` when a save was
    /// interrupted between its two renames). Every fault is a typed error
    /// naming the file or entry: a missing or unreadable file, damaged JSON
    /// or safetensors, a newer format version, tensors that do not belong.
    pub fn load(dir: impl AsRef<Path>) -> Result<Checkpoint> {
        let mut dir = dir.as_ref().to_path_buf();
        if !dir.exists() {
            let (_, previous) = siblings(&dir)?;
            if previous.join(MANIFEST_FILE).exists() {
                dir = previous;
            }
        }
        let manifest_path = dir.join(MANIFEST_FILE);
        let text = std::fs::read(&manifest_path)
            .map_err(|e| path_fault(&manifest_path, format!("cannot read: {e}")))?;
        let manifest: Manifest = serde_json::from_slice(&text)
            .map_err(|e| path_fault(&manifest_path, format!("not a valid checkpoint: {e}")))?;
        if manifest.format != FORMAT {
            return Err(path_fault(
                &manifest_path,
                format!("format is `{}`, not `{FORMAT}`", manifest.format),
            ));
        }
        if manifest.version > FORMAT_VERSION {
            return Err(path_fault(
                &manifest_path,
                format!(
                    "format version {} is newer than this leangrad reads ({FORMAT_VERSION})",
                    manifest.version
                ),
            ));
        }
        manifest.check_counts(&manifest_path)?;
        let model = read_tensors(&dir.join(MODEL_FILE))?;
        let tensors = read_tensors(&dir.join(OPTIMIZER_FILE))?;
        let optimizer = manifest.optimizer.into_state(tensors)?;
        Ok(Checkpoint {
            model,
            optimizer,
            schedule: manifest.schedule,
            progress: manifest.progress,
            metadata: manifest.metadata,
        })
    }

    /// Puts the checkpoint back into a model (its state dict, as given to
    /// [`Checkpoint::capture`]), an optimizer and, if given, a schedule.
    /// Each part checks everything before writing (strict names, shapes and
    /// dtype classes for the model; see
    /// [`Optimizer::load_state_dict_named`] and [`Scheduler::load_state`]);
    /// when a later part fails, the optimizer and schedule are put back as
    /// they were, so on error nothing has changed. A schedule given to a
    /// checkpoint saved without one is an error; a saved schedule may be
    /// left out.
    pub fn restore<A: CheckpointHyper>(
        &self,
        model: &[(String, Tensor)],
        optimizer: &mut Optimizer<A>,
        schedule: Option<&mut dyn Scheduler>,
    ) -> Result<LoadReport> {
        let schedule = match (schedule, &self.schedule) {
            (Some(s), Some(saved)) => Some((s, saved)),
            (Some(_), None) => {
                return Err(fault(
                    "schedule",
                    "the checkpoint was saved without a schedule",
                ))
            }
            (None, _) => None,
        };
        let optimizer_before = optimizer.state_dict_named(model)?;
        optimizer.load_state_dict_named(&self.optimizer, model)?;
        let mut schedule_before = None;
        if let Some((s, saved)) = schedule {
            let before = s.state();
            if let Err(e) = s.load_state(saved) {
                optimizer.load_state_dict_named(&optimizer_before, model)?;
                return Err(e);
            }
            schedule_before = Some((s, before));
        }
        match load_into(model, &self.model, LoadOptions { strict: true }) {
            Ok(report) => Ok(report),
            Err(e) => {
                optimizer.load_state_dict_named(&optimizer_before, model)?;
                if let Some((s, before)) = schedule_before {
                    s.load_state(&before)?;
                }
                Err(e)
            }
        }
    }

    fn manifest(&self) -> Result<Manifest> {
        let o = &self.optimizer;
        Ok(Manifest {
            format: FORMAT.to_string(),
            version: FORMAT_VERSION,
            progress: self.progress,
            optimizer: OptimizerManifest {
                kind: o.kind.clone(),
                param_groups: o
                    .param_groups
                    .iter()
                    .map(|g| GroupManifest {
                        hyper: g.hyper.clone(),
                        params: g.params.clone(),
                        param_names: g.param_names.clone(),
                    })
                    .collect(),
                state: o
                    .state
                    .iter()
                    .map(|(&id, s)| (id, StepManifest { step: s.step }))
                    .collect(),
                steps: o.steps,
                accumulation: o.accumulation,
                micro_batch: o.micro_batch,
                clip: ClipManifest::from(o.clip),
                pending_global_norm: o.pending_global_norm,
                grads_saved: o.grads.is_some(),
            },
            schedule: self.schedule.clone(),
            metadata: self.metadata.clone(),
        })
    }
}

/// `dir.partial` and `dir.previous`, beside `dir`.
fn siblings(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let name = dir
        .file_name()
        .ok_or_else(|| path_fault(dir, "a checkpoint folder needs a name"))?
        .to_string_lossy()
        .into_owned();
    Ok((
        dir.with_file_name(format!("{name}.partial")),
        dir.with_file_name(format!("{name}.previous")),
    ))
}

fn io_fault(path: &Path, e: std::io::Error) -> Error {
    path_fault(path, format!("cannot write: {e}"))
}

/// The names in folder `dir`, or `None` when nothing is there; a file or a
/// symbolic link where a folder should be is an error (never followed,
/// never replaced).
fn folder_contents(dir: &Path) -> Result<Option<Vec<String>>> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(path_fault(dir, format!("cannot read: {e}"))),
    };
    if !meta.is_dir() {
        let what = if meta.file_type().is_symlink() {
            "a symbolic link"
        } else {
            "a file"
        };
        return Err(path_fault(
            dir,
            format!("is {what}, not a folder leangrad wrote: choose another checkpoint folder"),
        ));
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| path_fault(dir, format!("cannot read: {e}")))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| path_fault(dir, format!("cannot read: {e}")))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(Some(names))
}

/// Refuses a folder holding anything but the checkpoint's three files
/// (a sub-folder, or a file leangrad did not write).
fn only_checkpoint_files(dir: &Path, names: &[String]) -> Result<()> {
    let ours = [MODEL_FILE, OPTIMIZER_FILE, MANIFEST_FILE];
    match names.iter().find(|n| !ours.contains(&n.as_str())) {
        None => Ok(()),
        Some(foreign) => Err(path_fault(
            dir,
            format!(
                "holds `{foreign}`, which is not a checkpoint file leangrad wrote; leangrad never \
                 replaces or removes a folder with other contents: choose another checkpoint folder"
            ),
        )),
    }
}

/// Whether `dir/checkpoint.json` is a leangrad manifest (its `format`).
fn is_leangrad_manifest(dir: &Path) -> bool {
    #[derive(Deserialize)]
    struct Format {
        format: String,
    }
    std::fs::read(dir.join(MANIFEST_FILE))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Format>(&bytes).ok())
        .is_some_and(|f| f.format == FORMAT)
}

/// Removes a folder of checkpoint files (a stale `.partial`, an old or
/// half-removed `.previous`) file by file, then the folder itself, which
/// fails rather than remove anything else.
fn remove_checkpoint_folder(dir: &Path) -> Result<()> {
    let Some(names) = folder_contents(dir)? else {
        return Ok(());
    };
    only_checkpoint_files(dir, &names)?;
    for name in &names {
        let path = dir.join(name);
        std::fs::remove_file(&path).map_err(|e| io_fault(&path, e))?;
    }
    std::fs::remove_dir(dir).map_err(|e| io_fault(dir, e))
}

/// Makes a folder's entries durable where the platform allows it (a failure
/// only weakens durability across power loss, so it is not an error).
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

fn read_tensors(path: &Path) -> Result<BTreeMap<String, Tensor>> {
    load_safetensors(path).map_err(|e| match e {
        Error::File { source, .. } => path_fault(path, format!("cannot read: {source}")),
        other => other,
    })
}

fn optimizer_tensors(o: &OptimizerState) -> Vec<(String, Tensor)> {
    let state = o.state.iter().flat_map(|(id, s)| {
        s.tensors
            .iter()
            .map(move |(slot, t)| (format!("state.{id}.{slot}"), t.clone()))
    });
    let accumulated = o
        .accumulated
        .iter()
        .map(|(id, t)| (format!("accumulated.{id}"), t.clone()));
    let grads = o
        .grads
        .iter()
        .flatten()
        .map(|(id, t)| (format!("grad.{id}"), t.clone()));
    state.chain(accumulated).chain(grads).collect()
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    format: String,
    version: u32,
    #[serde(default)]
    progress: Progress,
    optimizer: OptimizerManifest,
    #[serde(default)]
    schedule: Option<ScheduleState>,
    #[serde(default)]
    metadata: Map<String, Value>,
}

/// The largest count (epoch, step) a checkpoint may hold: the
/// optimizer's [`crate::optim::MAX_STEP_COUNT`] (2^53).
pub const MAX_COUNT: u64 = crate::optim::MAX_STEP_COUNT;

impl Manifest {
    /// Refuses counts past [`MAX_COUNT`], naming the entry, so that no
    /// arithmetic on them can wrap (a wrapped step count turns Adam's bias
    /// correction into a division by zero).
    fn check_counts(&self, path: &Path) -> Result<()> {
        let o = &self.optimizer;
        let counts = [
            ("progress.epoch".to_string(), self.progress.epoch),
            ("progress.step".to_string(), self.progress.step),
            ("optimizer.steps".to_string(), o.steps),
        ]
        .into_iter()
        .chain(
            o.state
                .iter()
                .map(|(id, s)| (format!("optimizer.state.{id}.step"), s.step)),
        );
        for (entry, value) in counts {
            if value > MAX_COUNT {
                return Err(path_fault(
                    path,
                    format!("{entry} is {value}, past the largest count a checkpoint holds ({MAX_COUNT})"),
                ));
            }
        }
        Ok(())
    }
}

/// PyTorch's `param_groups` entry: the hyper-parameters beside `params`.
#[derive(Serialize, Deserialize)]
struct GroupManifest {
    #[serde(flatten)]
    hyper: Map<String, Value>,
    params: Vec<usize>,
    #[serde(default)]
    param_names: Vec<Option<String>>,
}

#[derive(Serialize, Deserialize)]
struct StepManifest {
    step: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
enum ClipManifest {
    None,
    Value { bound: f64 },
    ParamNorm { max_norm: f64 },
    GlobalNorm { max_norm: f64 },
}

impl From<Clip> for ClipManifest {
    fn from(c: Clip) -> Self {
        match c {
            Clip::None => ClipManifest::None,
            Clip::Value(bound) => ClipManifest::Value { bound },
            Clip::ParamNorm(max_norm) => ClipManifest::ParamNorm { max_norm },
            Clip::GlobalNorm(max_norm) => ClipManifest::GlobalNorm { max_norm },
        }
    }
}

impl From<ClipManifest> for Clip {
    fn from(c: ClipManifest) -> Self {
        match c {
            ClipManifest::None => Clip::None,
            ClipManifest::Value { bound } => Clip::Value(bound),
            ClipManifest::ParamNorm { max_norm } => Clip::ParamNorm(max_norm),
            ClipManifest::GlobalNorm { max_norm } => Clip::GlobalNorm(max_norm),
        }
    }
}

fn one() -> usize {
    1
}

#[derive(Serialize, Deserialize)]
struct OptimizerManifest {
    kind: String,
    param_groups: Vec<GroupManifest>,
    #[serde(default)]
    state: BTreeMap<usize, StepManifest>,
    #[serde(default)]
    steps: u64,
    #[serde(default = "one")]
    accumulation: usize,
    #[serde(default)]
    micro_batch: usize,
    #[serde(default = "no_clip")]
    clip: ClipManifest,
    #[serde(default)]
    pending_global_norm: Option<f64>,
    #[serde(default)]
    grads_saved: bool,
}

fn no_clip() -> ClipManifest {
    ClipManifest::None
}

/// A parameter id in a tensor name (`state.{id}.…`), checked.
fn parse_id(name: &str, text: &str) -> Result<usize> {
    text.parse()
        .map_err(|_| fault(name, format!("`{text}` is not a parameter id")))
}

impl OptimizerManifest {
    /// The state, with the tensors of `optimizer.safetensors` put in place.
    fn into_state(self, tensors: BTreeMap<String, Tensor>) -> Result<OptimizerState> {
        let mut state: BTreeMap<usize, SavedParamState> = self
            .state
            .into_iter()
            .map(|(id, s)| {
                let saved = SavedParamState {
                    step: s.step,
                    tensors: BTreeMap::new(),
                };
                (id, saved)
            })
            .collect();
        let mut accumulated = BTreeMap::new();
        let mut grads = self.grads_saved.then(BTreeMap::new);
        for (name, t) in tensors {
            let parts: Vec<&str> = name.splitn(3, '.').collect();
            match parts.as_slice() {
                ["state", id, slot] => {
                    let id = parse_id(&name, id)?;
                    let s = state.get_mut(&id).ok_or_else(|| {
                        fault(
                            name.as_str(),
                            format!("{MANIFEST_FILE} has no step count for parameter {id}"),
                        )
                    })?;
                    s.tensors.insert(slot.to_string(), t);
                }
                ["accumulated", id] => {
                    accumulated.insert(parse_id(&name, id)?, t);
                }
                ["grad", id] => {
                    let id = parse_id(&name, id)?;
                    grads
                        .as_mut()
                        .ok_or_else(|| {
                            fault(
                                name.as_str(),
                                format!("{MANIFEST_FILE} says no grads were saved"),
                            )
                        })?
                        .insert(id, t);
                }
                _ => return Err(fault(
                    name.as_str(),
                    "not an optimizer tensor (state.{id}.{name}, accumulated.{id} or grad.{id})",
                )),
            }
        }
        Ok(OptimizerState {
            kind: self.kind,
            param_groups: self
                .param_groups
                .into_iter()
                .map(|g| GroupState {
                    param_names: if g.param_names.is_empty() {
                        vec![None; g.params.len()]
                    } else {
                        g.param_names
                    },
                    hyper: g.hyper,
                    params: g.params,
                })
                .collect(),
            state,
            accumulated,
            grads,
            steps: self.steps,
            accumulation: self.accumulation,
            micro_batch: self.micro_batch,
            clip: self.clip.into(),
            pending_global_norm: self.pending_global_norm,
        })
    }
}
