//! The crate's typed error. Every fallible public function returns [`Result`].

use crate::{DType, Device};

/// Everything that can go wrong in leangrad, with enough context to act on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Two shapes that had to agree (or broadcast) did not.
    #[error("shape mismatch in {op}: {lhs:?} vs {rhs:?}")]
    ShapeMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The first shape (or the one expected).
        lhs: Vec<usize>,
        /// The second shape (or the one given).
        rhs: Vec<usize>,
    },
    /// A shape or argument is not valid for the operation.
    #[error("invalid argument to {op}: {msg}")]
    InvalidArgument {
        /// The operation that failed.
        op: &'static str,
        /// What is wrong with the argument.
        msg: String,
    },
    /// The operation needed a different dtype.
    #[error("dtype mismatch in {op}: expected {expected:?}, got {got:?}")]
    DTypeMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The dtype it needed.
        expected: DType,
        /// The dtype it was given.
        got: DType,
    },
    /// The operation is not defined for this dtype.
    #[error("{op} does not support dtype {dtype:?}")]
    UnsupportedDType {
        /// The operation that failed.
        op: &'static str,
        /// The dtype it was given.
        dtype: DType,
    },
    /// Tensors on different devices were combined.
    #[error("device mismatch in {op}: {lhs} vs {rhs}")]
    DeviceMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The first operand's device.
        lhs: Device,
        /// The second operand's device.
        rhs: Device,
    },
    /// The device was asked for explicitly but cannot be used.
    #[error("device {device} is not available: {reason}")]
    DeviceUnavailable {
        /// The device asked for.
        device: Device,
        /// Why it cannot be used.
        reason: String,
    },
    /// The op has no CUDA kernel yet (the layers' kernels: convolution,
    /// norms, pooling, dropout, masks, attention, embedding, optimizer
    /// updates). Copy the tensors to the CPU to run it there.
    #[error("{op} is not implemented on CUDA yet ({device}); run it on the CPU")]
    NotOnCuda {
        /// The op.
        op: &'static str,
        /// The CUDA device its inputs live on.
        device: Device,
    },
    /// A CUDA driver, cuBLAS or launch call failed on a device that is open.
    #[error("CUDA error on {device} in {op}: {msg}")]
    Cuda {
        /// The device the call was made on.
        device: Device,
        /// What was being done (e.g. `launch unary_f32`, `cublasGemmEx`).
        op: String,
        /// The driver's or library's message.
        msg: String,
    },
    /// NVRTC could not compile a kernel file; `log` is the compiler's output.
    #[error("NVRTC failed to compile kernels/{file} for {arch}: {msg}\n{log}")]
    KernelCompile {
        /// The kernel file (e.g. `elementwise.cu`).
        file: String,
        /// The virtual architecture it was compiled for (e.g. `compute_90`).
        arch: String,
        /// NVRTC's status.
        msg: String,
        /// The compiler log.
        log: String,
    },
    /// The values of a meta-device tensor were asked for: meta tensors have
    /// shapes, dtypes and counted sizes but no data.
    #[error("{op}: a tensor on the meta device has no data (only its shape, dtype and size)")]
    NoData {
        /// The operation that asked for the values.
        op: &'static str,
    },
    /// A dimension index outside `-rank..rank`.
    #[error("dimension {dim} out of range for a tensor of rank {rank} in {op}")]
    DimOutOfRange {
        /// The operation that failed.
        op: &'static str,
        /// The dimension given.
        dim: isize,
        /// The tensor's rank.
        rank: usize,
    },
    /// An index value (gather, index_select, class target) outside its axis.
    #[error("index {index} out of range for an axis of size {size} in {op}")]
    IndexOutOfRange {
        /// The operation that failed.
        op: &'static str,
        /// The index value found.
        index: i64,
        /// The size of the axis it indexes.
        size: usize,
    },
    /// A tensor saved for backward was changed in place before backward used it.
    #[error(
        "a tensor saved for backward by {op} was modified in place after it was saved \
         (saved at version {saved_version}, now at version {current_version}); \
         clone it before modifying it, or modify it after backward"
    )]
    SavedTensorModified {
        /// The op that saved the tensor.
        op: String,
        /// The tensor's version counter when it was saved.
        saved_version: u64,
        /// Its version counter when backward read it.
        current_version: u64,
    },
    /// backward was asked of something that cannot be differentiated this way.
    #[error("backward: {0}")]
    Backward(String),
    /// An in-place change of a tensor the autograd graph still depends on.
    #[error("in-place {op} on a tensor that requires grad while grad mode is enabled; use no_grad() or detach()")]
    InPlaceOnRequiresGrad {
        /// The in-place operation.
        op: &'static str,
    },
    /// The allocator could not satisfy a request.
    #[error("out of memory on {device}: asked for {requested} bytes while {live} bytes are live\n{summary}")]
    OutOfMemory {
        /// The device whose limit was hit.
        device: Device,
        /// Bytes of the allocation that failed.
        requested: usize,
        /// Bytes live on the device at the time.
        live: usize,
        /// The ledger's report at the time, as a table.
        summary: String,
    },
    /// A run was refused before it started: its peak, predicted on the
    /// meta device, is more than the device has free.
    #[error(
        "{what} needs {} on {device} (predicted on the meta device), but {device} has only {} free{}: \
         {} short; make the run smaller (batch, sizes, model) or free memory",
        bytes_text(*needed),
        bytes_text(*available),
        if device.is_cpu() { " (MemAvailable + SwapFree)" } else { "" },
        bytes_text(needed.saturating_sub(*available))
    )]
    WillNotFit {
        /// What was refused (e.g. `the demo`, `one resnet18 step`).
        what: String,
        /// The device it was to run on.
        device: Device,
        /// Its predicted peak, in bytes.
        needed: usize,
        /// Bytes the device has free.
        available: usize,
    },
    /// A weights file (safetensors, a PyTorch `.pt`/`.pth` zip, or a
    /// buffer) that cannot be read as one: the reason and, where known, the
    /// tensor.
    #[error("malformed weights in {what}{}: {reason}", tensor.as_ref().map(|t| format!(" (tensor `{t}`)")).unwrap_or_default())]
    MalformedWeights {
        /// The file's path, or `<bytes>` for an in-memory buffer.
        what: String,
        /// The tensor at fault, where known.
        tensor: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// A weights file holds a tensor of a dtype leangrad has no type for.
    #[error("tensor `{tensor}` has dtype {dtype}, which leangrad does not support")]
    UnsupportedWeightDType {
        /// The tensor's name in the file.
        tensor: String,
        /// The file's dtype name (e.g. `I8`).
        dtype: String,
    },
    /// A state dict does not fit a module: every problem, listed together.
    #[error(
        "{}",
        describe_mismatch(missing, unexpected, mismatched, wrong_dtype, hints)
    )]
    StateDictMismatch {
        /// Names the module has but the state dict lacks (sorted).
        missing: Vec<String>,
        /// Names the state dict has but the module lacks (sorted).
        unexpected: Vec<String>,
        /// `(name, module shape, state-dict shape)` where the shapes differ.
        mismatched: Vec<(String, Vec<usize>, Vec<usize>)>,
        /// `(name, module dtype, state-dict dtype)` where one is a float and
        /// the other an integer type.
        wrong_dtype: Vec<(String, DType, DType)>,
        /// What may explain it: a prefix to strip or add, the model the
        /// file seems to be of.
        hints: Vec<String>,
    },
    /// A layer was given an input it cannot take; `layer` is its name in
    /// the model (its scope path, e.g. `layer1.0.conv1`).
    #[error("{layer} expects {expected}, got {got}")]
    LayerInput {
        /// The layer's name.
        layer: String,
        /// What it takes (e.g. `3 input channels`).
        expected: String,
        /// What it was given.
        got: String,
    },
    /// A layer name a model does not have (feature extraction by name).
    #[error("{model} has no layer `{name}`; valid names: {}", valid.join(", "))]
    UnknownLayer {
        /// The model asked (e.g. `ResNet`).
        model: &'static str,
        /// The name given.
        name: String,
        /// Every name the model answers to, in the order it runs them.
        valid: Vec<String>,
    },
    /// Pretrained weights that are not installed where leangrad looks for
    /// them; `hint` says how to install them.
    #[error("{model} weights not found: {reason}; {hint}")]
    PretrainedNotFound {
        /// The model (e.g. `all-MiniLM-L6-v2`).
        model: &'static str,
        /// Where leangrad looked and what it found.
        reason: String,
        /// How to install them (the command to run).
        hint: String,
    },
    /// A pretrained model's configuration or tokenizer file is missing,
    /// malformed or asks for something leangrad does not have.
    #[error("model file {}: {reason}", path.display())]
    ModelFile {
        /// The file at fault (e.g. `…/config.json`, `…/tokenizer.json`).
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A file could not be read or written: `path` names it.
    #[error("cannot {action} {}: {source}", path.display())]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// What was being done: `read`, `write`.
        action: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// A checkpoint, or an optimizer's or schedule's saved state, cannot
    /// be read or does not fit what it is loaded into.
    #[error("checkpoint entry `{entry}`: {reason}")]
    Checkpoint {
        /// What is at fault: a file's path, or an entry such as
        /// `state.3.exp_avg`, `param_groups.0.lr` or `kind`.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An image file (or an image folder) could not be read, decoded or
    /// written: `path` names it, `reason` says why.
    #[error("image {}: {reason}", path.display())]
    Image {
        /// The file or folder at fault.
        path: std::path::PathBuf,
        /// What is wrong (the decoder's or the file system's message).
        reason: String,
    },
    /// An output file (a report, a timeline, a plot) could not be made or
    /// written: `path` names it, `reason` says why.
    #[error("cannot write {}: {reason}", path.display())]
    OutputFile {
        /// The file at fault.
        path: std::path::PathBuf,
        /// What is wrong (an unknown extension, the file system's message).
        reason: String,
    },
    /// An optimisation diverged (its loss became non-finite or rose far
    /// above where it started) and was stopped: `job` names it, `reason`
    /// says what happened and what to try.
    #[error("{job} diverged: {reason}")]
    Diverged {
        /// The job (`style`).
        job: &'static str,
        /// What happened, and what to try instead.
        reason: String,
    },
    /// Setting up or running a process group failed: a rank that did not
    /// arrive in time, a port in use, ranks that disagree on the world size,
    /// a collective the ranks called differently, NCCL missing or failing.
    #[error("distributed (rank {rank}): {msg}")]
    Distributed {
        /// The rank that reports it.
        rank: usize,
        /// What happened.
        msg: String,
    },
}

/// `std::result::Result` with leangrad's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// `bytes` for people: `1.50 GiB (1610612736 bytes)`, or `512 bytes`.
fn bytes_text(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let (mut value, mut unit) = (bytes as f64, None);
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = Some(u);
    }
    match unit {
        Some(u) => format!("{value:.2} {u} ({bytes} bytes)"),
        None => format!("{bytes} bytes"),
    }
}

/// How many names of each kind a mismatch lists before `… and N more`.
const LISTED_NAMES: usize = 5;

/// `a, b, c, … and N more`: the first few of `items`.
fn first_few<T>(items: &[T], show: impl Fn(&T) -> String) -> String {
    let mut text: Vec<String> = items.iter().take(LISTED_NAMES).map(show).collect();
    if items.len() > LISTED_NAMES {
        text.push(format!("… and {} more", items.len() - LISTED_NAMES));
    }
    text.join(", ")
}

/// The readable text of [`crate::Error::StateDictMismatch`]: the counts of
/// each kind of problem, the first few names of each, then the hints.
fn describe_mismatch(
    missing: &[String],
    unexpected: &[String],
    mismatched: &[(String, Vec<usize>, Vec<usize>)],
    wrong_dtype: &[(String, DType, DType)],
    hints: &[String],
) -> String {
    let counts: Vec<String> = [
        (missing.len(), "missing"),
        (unexpected.len(), "unexpected"),
        (mismatched.len(), "of another shape"),
        (wrong_dtype.len(), "of another kind of dtype"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    let mut lines = vec![format!(
        "the weights do not match the model: {}",
        counts.join(", ")
    )];
    if !missing.is_empty() {
        let names = first_few(missing, String::clone);
        lines.push(format!("  missing from the file: {names}"));
    }
    if !unexpected.is_empty() {
        let names = first_few(unexpected, String::clone);
        lines.push(format!("  not in the model: {names}"));
    }
    if !mismatched.is_empty() {
        let shapes = first_few(mismatched, |(name, want, got)| {
            format!("{name} (model {want:?}, file {got:?})")
        });
        lines.push(format!("  other shapes: {shapes}"));
    }
    if !wrong_dtype.is_empty() {
        let dtypes = first_few(wrong_dtype, |(name, want, got)| {
            format!("{name} (model {want:?}, file {got:?})")
        });
        lines.push(format!("  other dtypes: {dtypes}"));
    }
    lines.extend(hints.iter().map(|h| format!("  hint: {h}")));
    lines.join("\n")
}
