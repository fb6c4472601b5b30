//! The jobs leangrad is for, as library functions with the same options as
//! their commands: [`adversarial`] (adversarial examples with every
//! parameter frozen: only the input gets a gradient) and [`finetune`]
//! (a classifier with a new head on an image folder, backbone frozen by
//! the named case).
//!
//! What they share lives here: choosing the device (`auto`, `cpu`,
//! `cuda`), building a model by name with or without weights, the image
//! files a job reads, and the progress bar (step, loss, throughput, ETA and
//! the ledger's current and peak device memory).

pub mod adversarial;
pub mod finetune;
pub mod style;

use crate::data::{
    has_image_extension, read_image_with, CenterCrop, ColorMode, Compose, Resize, SampleRng,
};
use crate::io::{load_safetensors, load_state_dict, LoadOptions};
use crate::memory::Ledger;
use crate::memory_plan::StepModel;
use crate::models::{
    MobileNetV2, MobileNetV2Config, ReplaceHead, ResNet, ResNetConfig, Vgg, VggConfig,
};
use crate::{DType, Device, Error, Result, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
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

/// An image classifier the jobs can use: a step model (forward to logits,
/// freezable by name) whose head can be replaced.
pub trait ImageClassifier: StepModel + ReplaceHead {}

impl<T: StepModel + ReplaceHead> ImageClassifier for T {}

/// The image classifiers the jobs know, by torchvision's names.
pub const CLASSIFIERS: &[&str] = &[
    "resnet18",
    "resnet50",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "mobilenet_v2",
];

/// The classifier `name` (one of [`CLASSIFIERS`]) with `classes` outputs,
/// randomly initialised (seed 0) in f32 on `device`.
pub fn build_classifier(
    name: &str,
    classes: usize,
    device: Device,
) -> Result<Box<dyn ImageClassifier>> {
    let f32 = DType::F32;
    Ok(match name {
        "resnet18" => Box::new(ResNet::new(
            ResNetConfig::resnet18(classes),
            f32,
            device,
            0,
        )?),
        "resnet50" => Box::new(ResNet::new(
            ResNetConfig::resnet50(classes),
            f32,
            device,
            0,
        )?),
        "vgg16" | "vgg16_bn" | "vgg19" | "vgg19_bn" => {
            let bn = name.ends_with("_bn");
            let config = if name.starts_with("vgg16") {
                VggConfig::vgg16(bn, classes)
            } else {
                VggConfig::vgg19(bn, classes)
            };
            Box::new(Vgg::new(&config, f32, device, 0)?)
        }
        "mobilenet_v2" => Box::new(MobileNetV2::new(
            &MobileNetV2Config::v2(classes),
            f32,
            device,
            0,
        )?),
        _ => {
            return Err(Error::InvalidArgument {
                op: "model",
                msg: format!("unknown model `{name}`; known: {}", CLASSIFIERS.join(", ")),
            })
        }
    })
}

/// The classifier `name` on `device` with `classes` outputs: with `weights`
/// (a safetensors file of the torchvision model's `state_dict()`, of any
/// class count), the weights are loaded strictly (every name and shape must
/// match) and the head is then replaced when its class count differs
/// (a fresh head, as `model.fc = nn.Linear(…, classes)`); without, the model
/// is randomly initialised.
pub fn image_model(
    name: &str,
    weights: Option<&Path>,
    classes: usize,
    device: Device,
) -> Result<Box<dyn ImageClassifier>> {
    let Some(path) = weights else {
        return build_classifier(name, classes, device);
    };
    let tensors = load_safetensors(path)?;
    let probe = build_classifier(name, classes, Device::Meta)?;
    let head = format!("{}.weight", probe.head_name());
    let file_classes = tensors.get(&head).map_or(classes, |w| w.shape()[0]);
    let mut model = build_classifier(name, file_classes, device)?;
    load_state_dict(model.as_ref(), &tensors, LoadOptions::default())?;
    if file_classes != classes {
        model.replace_head(classes, 0)?;
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
/// the jobs apply inside the differentiated function). An image whose
/// resize the host cannot hold is refused from its header, before it is
/// decoded ([`crate::data::read_image_with`]).
pub fn read_square(path: &Path, size: usize) -> Result<Tensor> {
    let pipeline = Compose::new()
        .then(Resize::shorter(size))
        .then(CenterCrop::square(size));
    read_image_with(path, ColorMode::Rgb, &pipeline, &mut SampleRng::new(0))
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

/// Bytes of one step of a job: predicted on the meta device under the lean
/// policy and keeping what PyTorch's autograd keeps, and the peak measured
/// over the whole run.
#[derive(Clone, Debug, Serialize)]
pub struct StepBytes {
    /// Peak of one step, lean (predicted).
    pub lean_step_bytes: usize,
    /// Peak of the same step keeping what PyTorch keeps (predicted).
    pub pytorch_step_bytes: usize,
    /// Peak measured on the device over the whole run.
    pub measured_peak_bytes: usize,
}

impl StepBytes {
    /// Refuses the run before anything is allocated when `device` has less
    /// free memory than the lean step's predicted peak
    /// ([`crate::Error::WillNotFit`], saying by how much).
    pub fn check_fits(&self, device: Device, step: &str) -> Result<()> {
        device.check_fits(&format!("one {step}"), self.lean_step_bytes)
    }

    /// One line for people: `memory of one <step>: … MiB (keeping what
    /// PyTorch keeps: … MiB, r×); measured peak … MiB`.
    pub fn describe(&self, step: &str) -> String {
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        format!(
            "memory of one {step}, parameters included: {:.1} MiB (keeping what PyTorch keeps: {:.1} MiB, {:.2}×); measured peak {:.1} MiB\n",
            mib(self.lean_step_bytes),
            mib(self.pytorch_step_bytes),
            self.pytorch_step_bytes as f64 / self.lean_step_bytes.max(1) as f64,
            mib(self.measured_peak_bytes)
        )
    }
}
