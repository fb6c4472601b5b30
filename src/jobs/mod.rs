//! The jobs leangrad is for, as library functions with the same options as
//! their commands: [`finetune`] (a classifier with a new head on an image
//! folder, backbone frozen by the named case), [`adversarial`]
//! (adversarial examples with every parameter frozen: only the input gets
//! a gradient) and [`style`] (neural style transfer: an image optimised
//! against a frozen VGG's features, only the image requiring grad).
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
use crate::io::{
    check_state_dict, load_state_dict, load_weights, rename_prefix, state_dict, LoadOptions,
    LoadReport,
};
use crate::memory::Ledger;
use crate::memory_plan::StepModel;
use crate::models::{
    AlexNet, AlexNetConfig, ConvNeXt, ConvNeXtConfig, EfficientNet, EfficientNetConfig,
    MobileNetV2, MobileNetV2Config, MobileNetV3, MobileNetV3Config, ReplaceHead, ResNet,
    ResNetConfig, Vgg, VggConfig,
};
use crate::{DType, Device, Error, Result, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
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
    "resnet101",
    "resnext101_64x4d",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "efficientnet_v2_s",
    "efficientnet_v2_m",
    "efficientnet_v2_l",
    "alexnet",
    "convnext_tiny",
    "convnext_small",
    "convnext_base",
    "convnext_large",
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
        "resnet101" => Box::new(ResNet::new(
            ResNetConfig::resnet101(classes),
            f32,
            device,
            0,
        )?),
        "resnext101_64x4d" => Box::new(ResNet::new(
            ResNetConfig::resnext101_64x4d(classes),
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
        "mobilenet_v3_large" => Box::new(MobileNetV3::new(
            &MobileNetV3Config::mobilenet_v3_large(classes),
            f32,
            device,
            0,
        )?),
        "efficientnet_v2_s" | "efficientnet_v2_m" | "efficientnet_v2_l" => {
            let config = match name {
                "efficientnet_v2_s" => EfficientNetConfig::efficientnet_v2_s(classes),
                "efficientnet_v2_m" => EfficientNetConfig::efficientnet_v2_m(classes),
                _ => EfficientNetConfig::efficientnet_v2_l(classes),
            };
            Box::new(EfficientNet::new(&config, f32, device, 0)?)
        }
        "alexnet" => Box::new(AlexNet::new(
            &AlexNetConfig::alexnet(classes),
            f32,
            device,
            0,
        )?),
        "convnext_tiny" | "convnext_small" | "convnext_base" | "convnext_large" => {
            let config = match name {
                "convnext_tiny" => ConvNeXtConfig::convnext_tiny(classes),
                "convnext_small" => ConvNeXtConfig::convnext_small(classes),
                "convnext_base" => ConvNeXtConfig::convnext_base(classes),
                _ => ConvNeXtConfig::convnext_large(classes),
            };
            Box::new(ConvNeXt::new(&config, f32, device, 0)?)
        }
        _ => {
            return Err(Error::InvalidArgument {
                op: "model",
                msg: format!("unknown model `{name}`; known: {}", CLASSIFIERS.join(", ")),
            })
        }
    })
}

/// How a job reads its weights file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightsLoading {
    /// Names must line up (PyTorch's `strict`, the default): every name of
    /// the model in the file and none besides, except that a file without
    /// the model's classifier (a backbone-only file) loads the backbone and
    /// the classifier starts fresh. When false, missing names start from
    /// the random initialisation and unexpected ones are ignored (both
    /// reported). Shapes must match either way.
    pub strict: bool,
    /// Removed from the front of every name of the file that starts with
    /// it (`module.` from a DistributedDataParallel checkpoint).
    pub strip_prefix: String,
    /// Put in front of every name of the file, after stripping.
    pub add_prefix: String,
}

impl Default for WeightsLoading {
    fn default() -> Self {
        WeightsLoading {
            strict: true,
            strip_prefix: String::new(),
            add_prefix: String::new(),
        }
    }
}

/// What a weights file gave a model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WeightsNote {
    /// The file.
    pub file: PathBuf,
    /// Tensors loaded from it.
    pub loaded: usize,
    /// The model's names the file lacks: they keep their random
    /// initialisation.
    pub fresh: Vec<String>,
    /// The file's names the model lacks: not used.
    pub ignored: Vec<String>,
    /// The file head's class count, when the head was replaced by a fresh
    /// one of the job's class count.
    pub replaced_head_of: Option<usize>,
}

impl WeightsNote {
    /// One or two lines for people.
    pub fn describe(&self) -> String {
        let few = |names: &[String]| {
            let mut shown: Vec<&str> = names.iter().take(4).map(String::as_str).collect();
            let more = names.len().saturating_sub(shown.len());
            let tail = format!("… and {more} more");
            if more > 0 {
                shown.push(&tail);
            }
            shown.join(", ")
        };
        let mut s = format!(
            "weights: {} tensors from {}",
            self.loaded,
            self.file.display()
        );
        if let Some(k) = self.replaced_head_of {
            s += &format!("; its {k}-class head replaced by a fresh one");
        }
        s.push('\n');
        if !self.fresh.is_empty() {
            s += &format!(
                "  not in the file, randomly initialised: {}\n",
                few(&self.fresh)
            );
        }
        if !self.ignored.is_empty() {
            s += &format!(
                "  in the file but not the model, ignored: {}\n",
                few(&self.ignored)
            );
        }
        s
    }
}

/// A classifier built for a job, and what its weights file gave it.
pub struct LoadedClassifier {
    /// The model.
    pub model: Box<dyn ImageClassifier>,
    /// What the weights file gave it (`None` without one).
    pub weights: Option<WeightsNote>,
}

/// The classifier `name` on `device` with `classes` outputs: with `weights`
/// (a safetensors or PyTorch `.pth` file of the torchvision model's `state_dict()`, of any
/// class count), the weights are loaded strictly (every name and shape must
/// match, though a file without the classifier loads the backbone) and the
/// head is then replaced when its class count differs (a fresh head, as
/// `model.fc = nn.Linear(…, classes)`); without, the model is randomly
/// initialised. See [`image_model_with`].
pub fn image_model(
    name: &str,
    weights: Option<&Path>,
    classes: usize,
    device: Device,
) -> Result<Box<dyn ImageClassifier>> {
    image_model_with(name, weights, &WeightsLoading::default(), classes, device).map(|m| m.model)
}

/// [`image_model`] with the loading rules of `loading`. Every name and
/// shape of the file is checked against the model built on the meta
/// device, and the model's bytes against the device's free memory, before
/// the model is built for real: a file of the wrong model, or whose head
/// is malformed or absurdly large, is refused without allocating it. A
/// mismatch names the first few names of each kind and, when the file
/// looks like another bundled model, says which.
pub fn image_model_with(
    name: &str,
    weights: Option<&Path>,
    loading: &WeightsLoading,
    classes: usize,
    device: Device,
) -> Result<LoadedClassifier> {
    let Some(path) = weights else {
        let model = build_classifier(name, classes, device)?;
        return Ok(LoadedClassifier {
            model,
            weights: None,
        });
    };
    let mut tensors = load_weights(path)?;
    if !(loading.strip_prefix.is_empty() && loading.add_prefix.is_empty()) {
        tensors = rename_prefix(tensors, &loading.strip_prefix, &loading.add_prefix)?;
    }
    let probe = build_classifier(name, classes, Device::Meta)?;
    let file_classes = head_classes(probe.as_ref(), &tensors, path)?;
    let sized = if file_classes == classes {
        probe
    } else {
        build_classifier(name, file_classes, Device::Meta)?
    };
    let report = check_weights(sized.as_ref(), name, &tensors, loading, path)?;
    let bytes: usize = state_dict(sized.as_ref(), "")
        .iter()
        .map(|(_, t)| t.numel() * t.dtype().size_in_bytes())
        .sum();
    device.check_fits(&format!("{name} with {file_classes} classes"), bytes)?;
    drop(sized);
    let mut model = build_classifier(name, file_classes, device)?;
    load_state_dict(model.as_ref(), &tensors, LoadOptions { strict: false })?;
    let replaced_head_of = (file_classes != classes).then_some(file_classes);
    if replaced_head_of.is_some() {
        model.replace_head(classes, 0)?;
    }
    Ok(LoadedClassifier {
        model,
        weights: Some(WeightsNote {
            file: path.to_path_buf(),
            loaded: report.loaded.len(),
            fresh: report.missing,
            ignored: report.unexpected,
            replaced_head_of,
        }),
    })
}

/// The class count of the file's head (`fc.weight`, `classifier.6.weight`…),
/// checked against the model's head before anything is built: a Linear
/// weight `[classes, in_features]` with the model's `in_features` and at
/// least one class. Without a head in the file, the job's `classes`.
fn head_classes(
    probe: &dyn ImageClassifier,
    tensors: &BTreeMap<String, Tensor>,
    path: &Path,
) -> Result<usize> {
    let head = format!("{}.weight", probe.head_name());
    let Some(w) = tensors.get(&head) else {
        return Ok(probe.num_classes());
    };
    let want = state_dict(probe, "")
        .into_iter()
        .find(|(n, _)| *n == head)
        .map(|(_, t)| t.shape().to_vec())
        .unwrap_or_default();
    match (w.shape(), want.as_slice()) {
        ([k, inner], [_, want_inner]) if *k >= 1 && inner == want_inner => Ok(*k),
        (got, _) => Err(Error::MalformedWeights {
            what: path.display().to_string(),
            tensor: Some(head.clone()),
            reason: format!(
                "has shape {got:?}; the model's head takes [classes, {}] with at least one class",
                want.get(1).map_or("?".to_string(), |d| d.to_string())
            ),
        }),
    }
}

/// Checks the file's names and shapes against `model` (on the meta
/// device) under `loading`'s rules; the report says what will load, start
/// fresh and be ignored. A mismatch gets a hint when the file looks like
/// another bundled model.
fn check_weights(
    model: &dyn ImageClassifier,
    name: &str,
    tensors: &BTreeMap<String, Tensor>,
    loading: &WeightsLoading,
    path: &Path,
) -> Result<LoadReport> {
    let destinations = state_dict(model, "");
    let lax = LoadOptions { strict: false };
    match check_state_dict(&destinations, tensors, LoadOptions { strict: true }) {
        Ok(report) => Ok(report),
        Err(Error::StateDictMismatch {
            missing,
            unexpected,
            mismatched,
            wrong_dtype,
            mut hints,
        }) => {
            let shapes_fit = mismatched.is_empty() && wrong_dtype.is_empty();
            let classifier = model.head_name().split('.').next().unwrap_or_default();
            let prefix = format!("{classifier}.");
            // A backbone-only file: the whole classifier is absent.
            let backbone_only = unexpected.is_empty()
                && missing.iter().all(|m| m.starts_with(&prefix))
                && !tensors.keys().any(|k| k.starts_with(&prefix));
            if shapes_fit && (backbone_only || !loading.strict) {
                return check_state_dict(&destinations, tensors, lax);
            }
            if let Some(hint) = other_model_hint(name, tensors) {
                hints.push(hint);
            }
            if !unexpected.is_empty() || !missing.is_empty() {
                hints.push(format!(
                    "{} holds {} tensors, {name} has {}",
                    path.display(),
                    tensors.len(),
                    destinations.len()
                ));
            }
            Err(Error::StateDictMismatch {
                missing,
                unexpected,
                mismatched,
                wrong_dtype,
                hints,
            })
        }
        Err(e) => Err(e),
    }
}

/// "this file looks like mobilenet_v2, not resnet18" when another bundled
/// classifier shares most of the file's names (and more of them than
/// `name` does).
fn other_model_hint(name: &str, tensors: &BTreeMap<String, Tensor>) -> Option<String> {
    let overlap = |model: &str| -> Option<(usize, usize)> {
        let m = build_classifier(model, 1, Device::Meta).ok()?;
        let names: Vec<String> = state_dict(m.as_ref(), "")
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let shared = names.iter().filter(|n| tensors.contains_key(*n)).count();
        Some((shared, names.len() + tensors.len() - shared))
    };
    let (own, _) = overlap(name)?;
    let (best, shared, union) = CLASSIFIERS
        .iter()
        .filter_map(|&m| overlap(m).map(|(s, u)| (m, s, u)))
        .max_by(|a, b| (a.1 * b.2).cmp(&(b.1 * a.2)))?;
    (best != name && shared > own && 2 * shared >= union).then(|| {
        format!(
            "this file looks like {best}, not {name} ({shared} of its {} names are {best}'s)",
            tensors.len()
        )
    })
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
