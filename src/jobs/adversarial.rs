//! Adversarial examples: FGSM, PGD (L∞) and PGD-L2 against an image
//! classifier whose every parameter is frozen and whose BatchNorms are in
//! evaluation mode (the `input-bn-eval` case), so backward computes only
//! the input's gradient and keeps only what that gradient needs.
//!
//! The attack works in pixel space (`[0, 1]` RGB, the image as read,
//! resized and centre-cropped); the ImageNet normalisation is applied
//! inside the differentiated function, so the perturbation bounds `eps`
//! and the step `alpha` are in pixel units (8/255 is 8 grey levels).
//!
//! Labels: when the image folder has sub-folders named by class index
//! (`207/`, `385/`), those are the labels and accuracies are reported;
//! otherwise the model's clean prediction stands for the label and the
//! success rate is the fraction whose prediction the attack changed (or,
//! targeted, moved to the target). Each image's clean and adversarial
//! predictions are reported with the model's confidence (softmax) and,
//! given a labels file, the classes' names.
//!
//! Outputs: the PNGs carry leangrad's marker ([`crate::data::PNG_MARKER`]);
//! an existing file at an output path is replaced only when it carries it.

use super::{image_files, image_model, read_square, ImageClassifier, Progress, StepBytes};
use crate::autograd::{no_grad, with_save_policy, SavePolicy};
use crate::data::{check_png_outputs, normalize, write_png, PngDepth, IMAGENET_MEAN, IMAGENET_STD};
use crate::memory::Ledger;
use crate::memory_plan::parse_case;
use crate::ops::CrossEntropyOptions;
use crate::{DType, Device, Error, Result, Tensor};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The attack (in reports by its usual name: `FGSM`, `PGD`, `PGD-L2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Attack {
    /// One step of `eps · sign(∇x loss)` (Goodfellow et al.).
    #[serde(rename = "FGSM")]
    Fgsm,
    /// `steps` steps of `alpha · sign(∇x loss)` from a random start in the
    /// L∞ ball of radius `eps`, projected back into it after each step
    /// (Madry et al.).
    #[serde(rename = "PGD")]
    Pgd,
    /// `steps` steps of `alpha · ∇x loss / ‖∇x loss‖₂` per image, projected
    /// into the L2 ball of radius `eps` (started at the image).
    #[serde(rename = "PGD-L2")]
    PgdL2,
}

impl std::fmt::Display for Attack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Attack::Fgsm => "FGSM",
            Attack::Pgd => "PGD",
            Attack::PgdL2 => "PGD-L2",
        })
    }
}

impl Attack {
    /// The attack called `name` (`fgsm`, `pgd`, `pgd-l2`).
    pub fn parse(name: &str) -> Result<Attack> {
        match name {
            "fgsm" => Ok(Attack::Fgsm),
            "pgd" => Ok(Attack::Pgd),
            "pgd-l2" => Ok(Attack::PgdL2),
            _ => Err(Error::InvalidArgument {
                op: "adversarial",
                msg: format!("unknown attack `{name}`; known: fgsm, pgd, pgd-l2"),
            }),
        }
    }
}

/// What [`run`] does; [`AdversarialOptions::new`] gives the defaults of
/// the `leangrad adversarial` command.
#[derive(Clone, Debug)]
pub struct AdversarialOptions {
    /// The model (`resnet18`, `vgg16`, `mobilenet_v2`, …).
    pub model: String,
    /// A safetensors file of the torchvision model's `state_dict()`; `None`
    /// attacks a randomly initialised model (and says so).
    pub weights: Option<PathBuf>,
    /// The folder of images (or of class-index sub-folders of images).
    pub images: PathBuf,
    /// Where the adversarial images are written, as PNG.
    pub out: PathBuf,
    /// The attack.
    pub attack: Attack,
    /// The perturbation bound (L∞ or L2, in pixel units).
    pub eps: f64,
    /// The step of the iterative attacks.
    pub alpha: f64,
    /// Steps of the iterative attacks (FGSM takes one).
    pub steps: usize,
    /// Push every image towards this class instead of away from its label.
    pub targeted: Option<usize>,
    /// Images are resized (shorter side) and centre-cropped to this size.
    pub size: usize,
    /// Images attacked at once.
    pub batch: usize,
    /// The classifier's classes.
    pub classes: usize,
    /// A file of the classes' names, one a line in class-index order (as
    /// many lines as `classes`), for the report.
    pub labels: Option<PathBuf>,
    /// Where to run.
    pub device: Device,
    /// Seed of PGD's random start.
    pub seed: u64,
    /// Leave out images that cannot be read (one warning per file) instead
    /// of stopping at the first with [`Error::Image`] naming it.
    pub skip_bad_images: bool,
    /// No progress bar.
    pub quiet: bool,
}

impl AdversarialOptions {
    /// PGD with eps 8/255, alpha 2/255, 10 steps, 224² images in batches of
    /// 8, 1000 classes, on the CPU.
    pub fn new(model: &str, images: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        AdversarialOptions {
            model: model.to_string(),
            weights: None,
            images: images.into(),
            out: out.into(),
            attack: Attack::Pgd,
            eps: 8.0 / 255.0,
            alpha: 2.0 / 255.0,
            steps: 10,
            targeted: None,
            size: 224,
            batch: 8,
            classes: 1000,
            labels: None,
            device: Device::Cpu,
            seed: 0,
            skip_bad_images: false,
            quiet: true,
        }
    }
}

/// One attacked image.
#[derive(Clone, Debug, Serialize)]
pub struct ImageResult {
    /// The image read.
    pub file: PathBuf,
    /// The adversarial image written.
    pub written: PathBuf,
    /// Its label, when the folder gives one.
    pub label: Option<usize>,
    /// The prediction on the clean image.
    pub clean: usize,
    /// The model's probability (softmax) of that prediction.
    pub clean_confidence: f64,
    /// Its name, with [`AdversarialOptions::labels`].
    pub clean_name: Option<String>,
    /// The prediction on the adversarial image.
    pub adversarial: usize,
    /// The model's probability of that prediction on the adversarial image.
    pub adversarial_confidence: f64,
    /// Its name, with [`AdversarialOptions::labels`].
    pub adversarial_name: Option<String>,
    /// Largest change of any pixel value.
    pub linf: f64,
    /// L2 norm of the perturbation.
    pub l2: f64,
}

/// The outcome of [`run`].
#[derive(Clone, Debug, Serialize)]
pub struct AdversarialReport {
    /// The model.
    pub model: String,
    /// Whether the model was randomly initialised (no weights given).
    pub random_init: bool,
    /// The attack and its parameters.
    pub attack: Attack,
    /// The bound.
    pub eps: f64,
    /// The step.
    pub alpha: f64,
    /// Steps taken.
    pub steps: usize,
    /// The target class, if targeted.
    pub targeted: Option<usize>,
    /// Where it ran.
    pub device: String,
    /// The images' folder (the files of [`ImageResult`] are in it).
    pub images_folder: PathBuf,
    /// Accuracy on the clean images (when labels are known).
    pub clean_accuracy: Option<f64>,
    /// Accuracy on the adversarial images (when labels are known).
    pub adversarial_accuracy: Option<f64>,
    /// Fraction of images the attack succeeded on: the prediction moved
    /// away from the label (or clean prediction), or onto the target.
    pub success_rate: f64,
    /// Mean and largest L∞ norm of the perturbations.
    pub linf_mean: f64,
    /// Largest L∞ norm.
    pub linf_max: f64,
    /// Mean L2 norm of the perturbations.
    pub l2_mean: f64,
    /// Memory, lean next to what PyTorch keeps.
    pub memory: StepBytes,
    /// Seconds the attack took.
    pub seconds: f64,
    /// Every image.
    pub images: Vec<ImageResult>,
}

/// Runs the attack on every image of `opts.images` and writes the
/// adversarial images to `opts.out` (same file stems, `.png`). Before any
/// work, every output path is checked: a file there that leangrad did not
/// write is [`Error::OutputFile`] naming it (nothing is overwritten); a
/// labels file whose line count is not `opts.classes` is
/// [`Error::InvalidArgument`] naming it.
pub fn run(opts: &AdversarialOptions) -> Result<AdversarialReport> {
    check(opts)?;
    let names = opts
        .labels
        .as_deref()
        .map(|path| read_labels(path, opts.classes))
        .transpose()?;
    let files = image_files(&opts.images)?;
    let outputs = claim_outputs(opts, &files)?;
    let memory = predict_memory(opts)?;
    memory.check_fits(opts.device, "attack step")?;
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let start = Instant::now();
    let mut model = image_model(
        &opts.model,
        opts.weights.as_deref(),
        opts.classes,
        opts.device,
    )?;
    parse_case("input-bn-eval")?.apply(model.as_mut())?;
    let batches: Vec<_> = files
        .chunks(opts.batch)
        .zip(outputs.chunks(opts.batch))
        .collect();
    let steps = if opts.attack == Attack::Fgsm {
        1
    } else {
        opts.steps
    };
    let progress = Progress::new(
        (batches.len() * steps) as u64,
        "attack",
        &ledger,
        opts.device,
        opts.quiet,
    );
    let mut results = Vec::new();
    for (b, &(files, outputs)) in batches.iter().enumerate() {
        let (chunk, images) = read_chunk(files, opts)?;
        if images.is_empty() {
            continue;
        }
        // The outputs of the images that were read (others were skipped).
        let written = files_and_outputs((files, outputs), &chunk);
        let x = Tensor::stack(&images.iter().collect::<Vec<_>>(), 0)?.to_device(opts.device)?;
        let labels: Vec<Option<usize>> = chunk
            .iter()
            .map(|(_, class)| class.as_deref().and_then(|c| c.parse().ok()))
            .map(|l: Option<usize>| l.filter(|&l| l < opts.classes))
            .collect();
        let (clean, clean_confidence) = predict(model.as_ref(), &x)?;
        let reference: Vec<usize> = labels
            .iter()
            .zip(&clean)
            .map(|(l, c)| l.unwrap_or(*c))
            .collect();
        let goal = opts
            .targeted
            .map_or(reference.clone(), |t| vec![t; chunk.len()]);
        let targets = Tensor::from_vec(
            goal.iter().map(|&t| t as i64).collect::<Vec<_>>(),
            &[goal.len()],
            opts.device,
        )?;
        let seed = opts.seed.wrapping_add(b as u64);
        let adv = attack(model.as_ref(), &x, &targets, opts, seed, &progress)?;
        let (adversarial, adversarial_confidence) = predict(model.as_ref(), &adv)?;
        let delta = adv.sub(&x)?;
        let linf = delta.abs()?.flatten(1, -1)?.max(1, false)?.to_f64_vec()?;
        let l2 = delta
            .square()?
            .sum(&[1, 2, 3], false)?
            .sqrt()?
            .to_f64_vec()?;
        for (i, ((file, _), written)) in chunk.iter().zip(written.iter()).enumerate() {
            if let Some(dir) = written.parent() {
                std::fs::create_dir_all(dir).map_err(|e| Error::Image {
                    path: dir.to_path_buf(),
                    reason: e.to_string(),
                })?;
            }
            write_png(&adv.narrow(0, i, 1)?, written, PngDepth::Eight)?;
            results.push(ImageResult {
                file: file.clone(),
                written: written.clone(),
                label: labels[i],
                clean: clean[i],
                clean_confidence: clean_confidence[i],
                clean_name: name_of(names.as_deref(), clean[i]),
                adversarial: adversarial[i],
                adversarial_confidence: adversarial_confidence[i],
                adversarial_name: name_of(names.as_deref(), adversarial[i]),
                linf: linf[i],
                l2: l2[i],
            });
        }
    }
    progress.finish();
    if results.is_empty() {
        return Err(Error::Image {
            path: opts.images.clone(),
            reason: format!("none of its {} image files could be read", files.len()),
        });
    }
    let seconds = start.elapsed().as_secs_f64();
    let memory = StepBytes {
        measured_peak_bytes: ledger.peak(opts.device),
        ..memory
    };
    Ok(summarise(opts, results, memory, seconds))
}

/// An image file and its class folder's name, as `image_files` lists them.
type ImageEntry = (PathBuf, Option<String>);

/// The output paths of `kept`, a subset of `batch`'s files in order.
fn files_and_outputs(batch: (&[ImageEntry], &[PathBuf]), kept: &[ImageEntry]) -> Vec<PathBuf> {
    let (files, outputs) = batch;
    files
        .iter()
        .zip(outputs)
        .filter(|(f, _)| kept.contains(f))
        .map(|(_, w)| w.clone())
        .collect()
}

/// The images of one batch that read, with their entries; with
/// `skip_bad_images`, one that cannot be read ([`Error::Image`]) is left
/// out with a warning on stderr, else it ends the run.
fn read_chunk(
    chunk: &[ImageEntry],
    opts: &AdversarialOptions,
) -> Result<(Vec<ImageEntry>, Vec<Tensor>)> {
    let (mut kept, mut images) = (Vec::new(), Vec::new());
    for entry in chunk {
        match read_square(&entry.0, opts.size) {
            Ok(image) => {
                kept.push(entry.clone());
                images.push(image);
            }
            Err(Error::Image { path, reason }) if opts.skip_bad_images => {
                eprintln!(
                    "warning: skipping unreadable image {}: {reason}",
                    path.display()
                );
            }
            Err(e) => return Err(e),
        }
    }
    Ok((kept, images))
}

/// Every file the run writes, one per image of `files`, checked before
/// any work ([`check_png_outputs`]: an existing file there must be one
/// leangrad wrote, so `--out` pointed at the images' own folder never
/// overwrites them), and the `--out` folder made.
fn claim_outputs(opts: &AdversarialOptions, files: &[ImageEntry]) -> Result<Vec<PathBuf>> {
    let outputs: Vec<PathBuf> = files
        .iter()
        .map(|(file, class)| written_path(&opts.out, file, class.as_deref()))
        .collect();
    check_png_outputs(outputs.iter().cloned(), "--out")?;
    std::fs::create_dir_all(&opts.out).map_err(|e| Error::Image {
        path: opts.out.clone(),
        reason: e.to_string(),
    })?;
    Ok(outputs)
}

fn check(opts: &AdversarialOptions) -> Result<()> {
    let bad = |msg: String| {
        Err(Error::InvalidArgument {
            op: "adversarial",
            msg,
        })
    };
    if !(opts.eps.is_finite() && opts.eps > 0.0) {
        return bad(format!("eps must be a positive number, not {}", opts.eps));
    }
    if opts.attack != Attack::Fgsm && !(opts.alpha.is_finite() && opts.alpha > 0.0) {
        return bad(format!(
            "alpha must be a positive number, not {}",
            opts.alpha
        ));
    }
    if opts.attack != Attack::Fgsm && opts.steps == 0 {
        return bad("steps must be at least 1".into());
    }
    if opts.batch == 0 || opts.size == 0 || opts.classes == 0 {
        return bad("batch, size and classes must be at least 1".into());
    }
    if let Some(t) = opts.targeted.filter(|&t| t >= opts.classes) {
        return bad(format!("target class {t} is not below {}", opts.classes));
    }
    Ok(())
}

/// The classes predicted for images `x` and the model's probability
/// (softmax) of each (no graph recorded).
fn predict(model: &dyn ImageClassifier, x: &Tensor) -> Result<(Vec<usize>, Vec<f64>)> {
    let _g = no_grad();
    let logits = model.step_logits(&normalize(x, &IMAGENET_MEAN, &IMAGENET_STD)?)?;
    let classes = logits
        .argmax(1, false)?
        .to_vec::<i64>()?
        .into_iter()
        .map(|c| c as usize)
        .collect();
    let confidence = logits.softmax(1)?.max(1, false)?.to_f64_vec()?;
    Ok((classes, confidence))
}

/// Largest labels file read: a name a line for every class, with room.
const MAX_LABELS_FILE_BYTES: u64 = 64 << 20;

/// The class names of the labels file `path`: one a line (surrounding
/// spaces trimmed), exactly `classes` lines, none empty; anything else is
/// [`Error::InvalidArgument`] naming the file (and, for a wrong count,
/// both counts).
pub fn read_labels(path: &Path, classes: usize) -> Result<Vec<String>> {
    let bad = |msg: String| Error::InvalidArgument {
        op: "adversarial",
        msg: format!("--labels {}: {msg}", path.display()),
    };
    let size = std::fs::metadata(path)
        .map_err(|e| bad(e.to_string()))?
        .len();
    if size > MAX_LABELS_FILE_BYTES {
        return Err(bad(format!(
            "{size} bytes is not a file of class names (one a line; at most {MAX_LABELS_FILE_BYTES} bytes)"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".into()))?;
    let names: Vec<String> = text.lines().map(|l| l.trim().to_string()).collect();
    if names.len() != classes {
        return Err(bad(format!(
            "{} class names (one a line), but the classifier has {classes} classes (--classes); give one name per class, in class-index order",
            names.len()
        )));
    }
    if let Some(line) = names.iter().position(String::is_empty) {
        return Err(bad(format!(
            "line {} is empty: every class needs a name",
            line + 1
        )));
    }
    Ok(names)
}

/// The name of class `class`, when there are names.
fn name_of(names: Option<&[String]>, class: usize) -> Option<String> {
    names.and_then(|n| n.get(class)).cloned()
}

/// The gradient of the mean cross-entropy to `targets` with respect to the
/// images `x` (in [0, 1]; ImageNet-normalised inside), and the loss: the
/// one backward of each attack step. Nothing else gets a gradient when the
/// model's parameters are frozen.
pub fn input_gradient(
    model: &dyn ImageClassifier,
    x: &Tensor,
    targets: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let x = x.detach().set_requires_grad(true)?;
    let logits = model.step_logits(&normalize(&x, &IMAGENET_MEAN, &IMAGENET_STD)?)?;
    let loss = logits.cross_entropy(targets, CrossEntropyOptions::default())?;
    loss.backward()?;
    let grad = x
        .take_grad()
        .ok_or_else(|| Error::Backward("the image received no gradient".into()))?;
    Ok((grad, loss.detach()))
}

/// The adversarial images of `x` `[N, 3, H, W]` (in [0, 1]) for the
/// class `targets` (the labels, or with `opts.targeted` the target), as
/// [`run`] makes them for each batch: `opts` gives the attack, `eps`,
/// `alpha`, `steps` and the device; `seed` PGD's random start.
pub fn perturb(
    model: &dyn ImageClassifier,
    x: &Tensor,
    targets: &Tensor,
    opts: &AdversarialOptions,
    seed: u64,
) -> Result<Tensor> {
    check(opts)?;
    let hidden = Progress::new(0, "", &Ledger::current(), opts.device, true);
    attack(model, x, targets, opts, seed, &hidden)
}

/// The adversarial images for `x`, one progress step per gradient.
fn attack(
    model: &dyn ImageClassifier,
    x: &Tensor,
    targets: &Tensor,
    opts: &AdversarialOptions,
    seed: u64,
    progress: &Progress,
) -> Result<Tensor> {
    // Untargeted attacks climb the loss of the label; targeted ones descend
    // the loss of the target.
    let direction = if opts.targeted.is_some() { -1.0 } else { 1.0 };
    let (eps, alpha) = (opts.eps, opts.alpha);
    let mut adv = match opts.attack {
        Attack::Fgsm => {
            let (g, loss) = input_gradient(model, x, targets)?;
            progress.step(loss.to_scalar()?);
            let _g = no_grad();
            return x
                .add(&g.sign()?.mul_scalar(direction * eps)?)?
                .clamp(0.0, 1.0);
        }
        Attack::Pgd => {
            let noise = Tensor::rand_range(x.shape(), -eps, eps, DType::F32, opts.device, seed)?;
            x.add(&noise)?.clamp(0.0, 1.0)?
        }
        Attack::PgdL2 => x.clone(),
    };
    for _ in 0..opts.steps {
        let (g, loss) = input_gradient(model, &adv, targets)?;
        progress.step(loss.to_scalar()?);
        let _g = no_grad();
        let delta = match opts.attack {
            Attack::PgdL2 => {
                let step = g.div(&per_image_l2(&g)?.add_scalar(1e-12)?)?;
                let delta = adv.add(&step.mul_scalar(direction * alpha)?)?.sub(x)?;
                let norm = per_image_l2(&delta)?;
                // Scale each perturbation by min(1, eps / ‖δ‖₂).
                let factor = norm
                    .add_scalar(1e-12)?
                    .recip()?
                    .mul_scalar(eps)?
                    .clamp(0.0, 1.0)?;
                delta.mul(&factor)?
            }
            _ => adv
                .add(&g.sign()?.mul_scalar(direction * alpha)?)?
                .sub(x)?
                .clamp(-eps, eps)?,
        };
        adv = x.add(&delta)?.clamp(0.0, 1.0)?;
    }
    Ok(adv)
}

/// ‖t_i‖₂ of each image of `t` `[N, C, H, W]`, shaped `[N, 1, 1, 1]`.
fn per_image_l2(t: &Tensor) -> Result<Tensor> {
    t.square()?.sum(&[1, 2, 3], true)?.sqrt()
}

/// One attack step of the first batch on the meta device, under the lean
/// policy and under PyTorch's, each in a fresh ledger.
fn predict_memory(opts: &AdversarialOptions) -> Result<StepBytes> {
    let peak = |policy: SavePolicy| -> Result<usize> {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let mut model = image_model(&opts.model, None, opts.classes, Device::Meta)?;
        parse_case("input-bn-eval")?.apply(model.as_mut())?;
        let n = opts.batch;
        let x = Tensor::zeros(&[n, 3, opts.size, opts.size], DType::F32, Device::Meta)?;
        let targets = Tensor::zeros(&[n], DType::I64, Device::Meta)?;
        let _p = with_save_policy(policy);
        drop(input_gradient(model.as_ref(), &x, &targets)?);
        Ok(ledger.peak(Device::Meta))
    };
    Ok(StepBytes {
        lean_step_bytes: peak(SavePolicy::Lean)?,
        pytorch_step_bytes: peak(SavePolicy::SaveAll)?,
        measured_peak_bytes: 0,
    })
}

fn summarise(
    opts: &AdversarialOptions,
    images: Vec<ImageResult>,
    memory: StepBytes,
    seconds: f64,
) -> AdversarialReport {
    let n = images.len().max(1) as f64;
    let labelled: Vec<&ImageResult> = images.iter().filter(|r| r.label.is_some()).collect();
    let accuracy = |pick: fn(&ImageResult) -> usize| {
        (!labelled.is_empty()).then(|| {
            labelled.iter().filter(|r| Some(pick(r)) == r.label).count() as f64
                / labelled.len() as f64
        })
    };
    let success = images
        .iter()
        .filter(|r| match opts.targeted {
            Some(t) => r.adversarial == t,
            None => r.adversarial != r.label.unwrap_or(r.clean),
        })
        .count() as f64
        / n;
    AdversarialReport {
        model: opts.model.clone(),
        random_init: opts.weights.is_none(),
        attack: opts.attack,
        eps: opts.eps,
        alpha: opts.alpha,
        steps: if opts.attack == Attack::Fgsm {
            1
        } else {
            opts.steps
        },
        targeted: opts.targeted,
        device: opts.device.to_string(),
        images_folder: opts.images.clone(),
        clean_accuracy: accuracy(|r| r.clean),
        adversarial_accuracy: accuracy(|r| r.adversarial),
        success_rate: success,
        linf_mean: images.iter().map(|r| r.linf).sum::<f64>() / n,
        linf_max: images.iter().map(|r| r.linf).fold(0.0, f64::max),
        l2_mean: images.iter().map(|r| r.l2).sum::<f64>() / n,
        memory,
        seconds,
        images,
    }
}

/// A few lines for people: accuracies, success, norms, memory.
pub fn describe(r: &AdversarialReport) -> String {
    let pct = |v: Option<f64>| v.map_or("n/a (no labels)".into(), |v| format!("{:.1}%", 100.0 * v));
    let mut s = String::new();
    if r.random_init {
        s += "note: no --weights given: the model is randomly initialised\n";
    }
    s += &format!(
        "{} on {} ({} images, {}): {} eps {:.4} alpha {:.4} steps {}{}\n",
        r.model,
        r.device,
        r.images.len(),
        format_args!("{:.1} s", r.seconds),
        r.attack,
        r.eps,
        r.alpha,
        r.steps,
        r.targeted
            .map_or(String::new(), |t| format!(" targeted at class {t}")),
    );
    s += &format!(
        "clean accuracy {}  adversarial accuracy {}  success rate {:.1}%\n",
        pct(r.clean_accuracy),
        pct(r.adversarial_accuracy),
        100.0 * r.success_rate
    );
    s += &format!(
        "perturbation: L∞ mean {:.4} max {:.4}, L2 mean {:.4}\n",
        r.linf_mean, r.linf_max, r.l2_mean
    );
    s += &r.memory.describe("attack step");
    s += "per image: file: clean prediction → adversarial prediction (the model's confidence)\n";
    for img in &r.images {
        s += &describe_image(img, &r.images_folder);
    }
    s
}

/// One line for one image: `3/cat.png: 281 tabby (62.1%) → 292 tiger
/// (48.0%)`, its label after the file when the folder gives one.
fn describe_image(img: &ImageResult, folder: &Path) -> String {
    let class = |c: usize, name: &Option<String>, p: f64| match name {
        Some(n) => format!("{c} {n} ({:.1}%)", 100.0 * p),
        None => format!("class {c} ({:.1}%)", 100.0 * p),
    };
    let file = img.file.strip_prefix(folder).unwrap_or(&img.file);
    let label = img.label.map_or(String::new(), |l| format!(" (label {l})"));
    format!(
        "  {}{label}: {} → {}\n",
        file.display(),
        class(img.clean, &img.clean_name, img.clean_confidence),
        class(
            img.adversarial,
            &img.adversarial_name,
            img.adversarial_confidence
        ),
    )
}

/// Where the adversarial image of `file` goes in `out`: `out/<stem>.png`,
/// or `out/<class>/<stem>.png` for a file of a class sub-folder (so that
/// `3/0.png` and `7/0.png` do not overwrite each other).
pub fn written_path(out: &Path, file: &Path, class: Option<&str>) -> PathBuf {
    let stem = file
        .file_stem()
        .map_or("image".into(), |s| s.to_string_lossy());
    let dir = class.map_or(out.to_path_buf(), |c| out.join(c));
    dir.join(format!("{stem}.png"))
}
