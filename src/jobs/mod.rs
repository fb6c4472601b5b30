//! The jobs leangrad is for, as library functions with the same options as
//! their commands: [`adversarial`] (adversarial examples with every
//! parameter frozen: only the input gets a gradient).
//!
//! What they share lives here: choosing the device (`auto`, `cpu`,
//! `cuda`), building a model by name with or without weights, the image
//! files a job reads, and the progress bar (step, loss, throughput, ETA and
//! the ledger's current and peak device memory).

pub mod adversarial;
pub mod style;

use crate::data::{has_image_extension, read_image, CenterCrop, Compose, Resize, Transform};
use crate::io::{load_safetensors, load_state_dict, LoadOptions};
use crate::memory::Ledger;
use crate::memory_plan::{find_model, InputKind, StepModel};
use crate::{DType, Device, Error, Result, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

/// `auto` (CUDA 0 when it can be opened, else the CPU), `cpu` or `cuda`
/// (CUDA 0; an error without one).
pub fn choose_device(choice: &str) -> Result<Device> {
    match choice {
        "cpu" => Ok(Device::Cpu),
        "cuda" => {
            Device::Cuda(0).check_available()?;
            Ok(Device::Cuda(0))
        }
        "auto" => Ok(if Device::Cuda(0).is_available() {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }),
        other => Err(Error::InvalidArgument {
            op: "device",
            msg: format!("unknown device `{other}`; use auto, cpu or cuda"),
        }),
    }
}

/// An image classifier by name (`resnet18`, `vgg16`, `mobilenet_v2`, … the
/// image models of `leangrad memory`), in f32 on `device`, with `classes`
/// outputs; with `weights` (a safetensors file of a torchvision
/// `state_dict()`), loaded strictly (every name and shape must match),
/// otherwise randomly initialised.
pub fn image_model(
    name: &str,
    weights: Option<&Path>,
    classes: usize,
    size: usize,
    device: Device,
) -> Result<Box<dyn StepModel>> {
    let entry = find_model(name)?;
    if !matches!(entry.input, InputKind::Image { .. }) {
        return Err(Error::InvalidArgument {
            op: "model",
            msg: format!("{name} does not read images"),
        });
    }
    let model = (entry.build)(classes, size, DType::F32, device)?;
    if let Some(path) = weights {
        let tensors = load_safetensors(path)?;
        load_state_dict(model.as_ref(), &tensors, LoadOptions::default())?;
    }
    Ok(model)
}

/// The image files of `dir`, sorted: the files directly in it, or, when it
/// has sub-folders, theirs, each with its sub-folder's name.
pub fn image_files(dir: &Path) -> Result<Vec<(PathBuf, Option<String>)>> {
    let io = |e: std::io::Error| Error::Image {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    };
    let mut found = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(io)?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            let class = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let mut inner: Vec<PathBuf> = std::fs::read_dir(&path)
                .map_err(io)?
                .map(|e| e.map(|e| e.path()))
                .collect::<std::io::Result<_>>()
                .map_err(io)?;
            inner.sort();
            found.extend(
                inner
                    .into_iter()
                    .filter(|p| p.is_file() && is_image(p))
                    .map(|p| (p, class.clone())),
            );
        } else if is_image(&path) {
            found.push((path, None));
        }
    }
    if found.is_empty() {
        return Err(Error::Image {
            path: dir.to_path_buf(),
            reason: "no image files (png, jpg, jpeg, bmp, …) in it or its sub-folders".into(),
        });
    }
    Ok(found)
}

fn is_image(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| has_image_extension(&n.to_string_lossy()))
}

/// Reads `path` as an RGB `[3, size, size]` image in [0, 1]: the shorter
/// side resized to `size` (antialiased), then the centre crop, as
/// torchvision's evaluation transforms (without the normalisation, which
/// the jobs apply inside the differentiated function).
pub fn read_square(path: &Path, size: usize) -> Result<Tensor> {
    let pipeline = Compose::new()
        .then(Resize::shorter(size))
        .then(CenterCrop::square(size));
    pipeline.apply_once(&read_image(path)?)
}

/// A progress bar on stderr (drawn only on a terminal) whose message shows
/// the loss, throughput and the ledger's current and peak memory of the
/// job's device.
pub struct Progress {
    bar: ProgressBar,
    ledger: Ledger,
    device: Device,
}

impl Progress {
    /// A bar of `total` steps; `quiet` hides it.
    pub fn new(total: u64, what: &str, ledger: &Ledger, device: Device, quiet: bool) -> Progress {
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(total)
        };
        let style = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(what.to_string());
        Progress {
            bar,
            ledger: ledger.clone(),
            device,
        }
    }

    /// One step done, with its loss.
    pub fn step(&self, loss: f64) {
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        self.bar.set_message(format!(
            "loss {loss:.4}  mem {:.1} MiB (peak {:.1} MiB)",
            mib(self.ledger.live(self.device)),
            mib(self.ledger.peak(self.device)),
        ));
        self.bar.inc(1);
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
