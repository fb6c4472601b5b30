//! Neural style transfer (Gatys, Ecker and Bethge), as PyTorch's tutorial
//! computes it: an image is optimised so that its VGG features match the
//! content image's at the content layers and its Gram matrices match the
//! style image's at the style layers.
//!
//! - **Images**: each is read as RGB in [0, 1] and resized (antialiased)
//!   so that its shorter side is `size`, keeping its aspect ratio (no
//!   crop). The result has the content image's size; the style image may
//!   have another (a Gram matrix is `C×C` whatever the size, and its
//!   normalisation by `C·H·W` makes sizes comparable).
//! - **Network**: VGG-19 (default) or VGG-16, features only (the
//!   classifier is never run, nor loaded), with the ImageNet normalisation
//!   inside its input. Losses read the **convolution outputs** (before
//!   ReLU, as the tutorial does): style conv1_1, conv2_1, conv3_1,
//!   conv4_1, conv5_1 and content conv4_2 (Gatys et al.'s layers):
//!   VGG-19 `features.0, 5, 10, 19, 28` and `features.21`; VGG-16
//!   `features.0, 5, 10, 17, 24` and `features.19`.
//! - **Losses**: content `content_weight · mse(F, F_content)`, style
//!   `style_weight · Σ mse(G, G_style)` with `G = F·Fᵀ / (C·H·W)`.
//! - **Only the image requires grad**: every VGG parameter is frozen, the
//!   targets are computed once without a graph, so backward computes the
//!   image's gradient and keeps only what it needs.
//! - **Optimisers**: Adam (one forward/backward per step, then the image
//!   is clamped to [0, 1]) or L-BFGS (PyTorch's defaults, one iteration per
//!   step with the tutorial's closure: clamp, loss, backward); either way a
//!   step is one evaluation of the loss and its gradient.
//! - **Divergence**: a loss that is not finite, one that stays above
//!   [`DIVERGENCE_FACTOR`] times the first step's for [`DIVERGENCE_STEPS`]
//!   steps, or a result whose loss is above that, stops the run with
//!   [`Error::Diverged`] before the result is written (see [`divergence`],
//!   [`divergence_at_end`]) unless [`StyleOptions::keep_going`].
//! - **Input convention**: torchvision's weights read `(x − mean) / std`
//!   of RGB in [0, 1]; Caffe's read BGR on 0–255 minus their mean
//!   ([`InputConvention`]).
//! - **Outputs** never overwrite a file leangrad did not write: the result
//!   and every frame are checked before the first step
//!   ([`crate::data::check_png_outputs`]).

mod transfer;

pub use transfer::{
    gram, load_vgg_features, InputConvention, StyleLosses, Transfer, CAFFE_MEAN_BGR,
};

use super::{Progress, StepBytes};
use crate::autograd::{with_save_policy, SavePolicy};
use crate::data::{
    check_png_outputs, read_image_header, read_image_with, write_png, ColorMode, PngDepth, Resize,
    ResizeTo, SampleRng,
};
use crate::memory::host::checked_count;
use crate::memory::Ledger;
use crate::models::{Vgg, VggConfig};
use crate::optim::{Adam, Lbfgs, LbfgsOptions, Optimizer};
use crate::{DType, Device, Error, Result, Tensor};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// VGG-19's style layers (conv1_1 … conv5_1, torchvision indices).
pub const VGG19_STYLE_LAYERS: [&str; 5] = [
    "features.0",
    "features.5",
    "features.10",
    "features.19",
    "features.28",
];
/// VGG-19's content layer (conv4_2).
pub const VGG19_CONTENT_LAYERS: [&str; 1] = ["features.21"];
/// VGG-16's style layers (conv1_1 … conv5_1).
pub const VGG16_STYLE_LAYERS: [&str; 5] = [
    "features.0",
    "features.5",
    "features.10",
    "features.17",
    "features.24",
];
/// VGG-16's content layer (conv4_2).
pub const VGG16_CONTENT_LAYERS: [&str; 1] = ["features.19"];

/// The network of a style transfer and the layers its losses read.
#[derive(Clone, Debug, PartialEq)]
pub struct StyleNet {
    /// Its name in reports (`vgg19`, `vgg16`).
    pub name: String,
    /// The VGG; only its `features` run.
    pub config: VggConfig,
    /// Layers whose Gram matrices are matched.
    pub style_layers: Vec<String>,
    /// Layers whose maps are matched.
    pub content_layers: Vec<String>,
}

impl StyleNet {
    /// VGG-19 with Gatys et al.'s layers.
    pub fn vgg19() -> StyleNet {
        Self::classic(
            "vgg19",
            VggConfig::vgg19(false, 1),
            &VGG19_STYLE_LAYERS,
            &VGG19_CONTENT_LAYERS,
        )
    }

    /// VGG-16 with the same layers (conv1_1 … conv5_1, conv4_2).
    pub fn vgg16() -> StyleNet {
        Self::classic(
            "vgg16",
            VggConfig::vgg16(false, 1),
            &VGG16_STYLE_LAYERS,
            &VGG16_CONTENT_LAYERS,
        )
    }

    /// `vgg19` or `vgg16`; anything else is [`Error::InvalidArgument`]
    /// naming it.
    pub fn named(name: &str) -> Result<StyleNet> {
        match name {
            "vgg19" => Ok(StyleNet::vgg19()),
            "vgg16" => Ok(StyleNet::vgg16()),
            _ => Err(Error::InvalidArgument {
                op: "style",
                msg: format!("unknown model `{name}`; use vgg19 or vgg16"),
            }),
        }
    }

    fn classic(name: &str, config: VggConfig, style: &[&str], content: &[&str]) -> StyleNet {
        StyleNet {
            name: name.to_string(),
            // The classifier is never run: keep it tiny instead of 120M
            // parameters.
            config: VggConfig {
                pool_size: 1,
                hidden: 1,
                num_classes: 1,
                ..config
            },
            style_layers: style.iter().map(|s| s.to_string()).collect(),
            content_layers: content.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// Adam or L-BFGS (in reports by their usual names, `Adam` and `L-BFGS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum StyleOptimizer {
    /// Adam (default lr 0.02).
    #[serde(rename = "Adam")]
    Adam,
    /// L-BFGS (default lr 1), one iteration per step.
    #[serde(rename = "L-BFGS")]
    Lbfgs,
}

impl std::fmt::Display for StyleOptimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StyleOptimizer::Adam => "Adam",
            StyleOptimizer::Lbfgs => "L-BFGS",
        })
    }
}

impl StyleOptimizer {
    /// `adam` or `lbfgs`.
    pub fn parse(name: &str) -> Result<StyleOptimizer> {
        match name {
            "adam" => Ok(StyleOptimizer::Adam),
            "lbfgs" => Ok(StyleOptimizer::Lbfgs),
            _ => Err(Error::InvalidArgument {
                op: "style",
                msg: format!("unknown optimizer `{name}`; use adam or lbfgs"),
            }),
        }
    }

    /// The learning rate used when none is given.
    pub fn default_lr(self) -> f64 {
        match self {
            StyleOptimizer::Adam => 0.02,
            StyleOptimizer::Lbfgs => 1.0,
        }
    }
}

/// Where the optimised image starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StyleInit {
    /// The content image (the tutorial's choice).
    Content,
    /// Uniform noise in [0, 1) (seeded).
    Noise,
}

/// What [`run`] does; [`StyleOptions::new`] gives the defaults of the
/// `leangrad style` command.
#[derive(Clone, Debug)]
pub struct StyleOptions {
    /// The network and its layers.
    pub net: StyleNet,
    /// A safetensors file of torchvision's VGG `state_dict()` (whole or
    /// `features.*` only); `None` runs a randomly initialised VGG (and
    /// says so).
    pub weights: Option<PathBuf>,
    /// The content image.
    pub content: PathBuf,
    /// The style image.
    pub style: PathBuf,
    /// The result, written as PNG; frames go next to it.
    pub out: PathBuf,
    /// Shorter side of both images after resizing.
    pub size: usize,
    /// Steps (loss-and-gradient evaluations).
    pub steps: usize,
    /// Weight of the content loss.
    pub content_weight: f64,
    /// Weight of the style loss.
    pub style_weight: f64,
    /// Adam or L-BFGS.
    pub optimizer: StyleOptimizer,
    /// Learning rate; `None` is the optimizer's default.
    pub lr: Option<f64>,
    /// Where the image starts.
    pub init: StyleInit,
    /// Seed of the noise start and of the random VGG.
    pub seed: u64,
    /// Write a frame `OUT-000100.png` every this many steps.
    pub every: Option<usize>,
    /// How the network's input is made from the image: torchvision's
    /// weights (the default) or Caffe's.
    pub input_convention: InputConvention,
    /// Run on when the loss diverges (see [`divergence`] and
    /// [`divergence_at_end`]) instead of
    /// stopping with [`Error::Diverged`]; the report says so.
    pub keep_going: bool,
    /// Where to run.
    pub device: Device,
    /// No progress bar.
    pub quiet: bool,
}

impl StyleOptions {
    /// VGG-19, 256-pixel images, 300 L-BFGS steps, content weight 1, style
    /// weight 10⁶ (the tutorial's), starting from the content image, on
    /// the CPU.
    pub fn new(
        content: impl Into<PathBuf>,
        style: impl Into<PathBuf>,
        out: impl Into<PathBuf>,
    ) -> StyleOptions {
        StyleOptions {
            net: StyleNet::vgg19(),
            weights: None,
            content: content.into(),
            style: style.into(),
            out: out.into(),
            size: 256,
            steps: 300,
            content_weight: 1.0,
            style_weight: 1e6,
            optimizer: StyleOptimizer::Lbfgs,
            lr: None,
            init: StyleInit::Content,
            seed: 0,
            every: None,
            input_convention: InputConvention::Torchvision,
            keep_going: false,
            device: Device::Cpu,
            quiet: true,
        }
    }
}

/// The outcome of [`run`].
#[derive(Clone, Debug, Serialize)]
pub struct StyleReport {
    /// The network.
    pub model: String,
    /// Whether the VGG was randomly initialised (no weights given).
    pub random_init: bool,
    /// The optimizer.
    pub optimizer: StyleOptimizer,
    /// Its learning rate.
    pub lr: f64,
    /// How the network's input was made from the image.
    pub input_convention: InputConvention,
    /// Where the image started.
    pub init: StyleInit,
    /// Steps taken.
    pub steps: usize,
    /// Height and width of the result.
    pub height: usize,
    /// Width of the result.
    pub width: usize,
    /// Where it ran.
    pub device: String,
    /// The weights of the two losses.
    pub content_weight: f64,
    /// Weight of the style loss.
    pub style_weight: f64,
    /// Losses of the final image (as written).
    pub losses: StyleLosses,
    /// Total loss at each step's evaluation, before its update.
    pub history: Vec<f64>,
    /// What [`divergence`] or [`divergence_at_end`] found, when the run
    /// went on past it
    /// ([`StyleOptions::keep_going`]): the result is then likely noise.
    pub diverged: Option<String>,
    /// The result.
    pub written: PathBuf,
    /// Frames written, in order.
    pub frames: Vec<PathBuf>,
    /// Memory, lean next to what PyTorch keeps.
    pub memory: StepBytes,
    /// Seconds the run took.
    pub seconds: f64,
}

/// Runs the style transfer of `opts` and writes the result (and frames).
/// An output path holding a file leangrad did not write is
/// [`Error::OutputFile`] before any work; a diverging loss is
/// [`Error::Diverged`] (unless `opts.keep_going`), and nothing more is
/// written.
pub fn run(opts: &StyleOptions) -> Result<StyleReport> {
    check(opts)?;
    check_png_outputs(outputs(opts), "--out")?;
    // Both images' sizes come from their headers, and the step is refused
    // before anything is decoded when it cannot fit.
    let content_shape = resized_shape(&opts.content, opts.size)?;
    let style_shape = resized_shape(&opts.style, opts.size)?;
    let memory = predict_memory(opts, &content_shape, &style_shape)?;
    memory.check_fits(opts.device, "style step")?;
    let content = read_resized(&opts.content, opts.size)?;
    let style = read_resized(&opts.style, opts.size)?;
    if let Some(dir) = opts.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::Image {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let start = Instant::now();
    let device = opts.device;
    let transfer = problem(opts, content, style)?;
    let progress = Progress::new(opts.steps as u64, "style", &ledger, device, opts.quiet);
    let lr = opts.lr.unwrap_or(opts.optimizer.default_lr());
    let optimised = optimise(opts, &transfer, lr, &progress);
    progress.finish();
    let Optimised {
        history,
        frames,
        diverged,
    } = optimised?;
    transfer.clamp_image()?;
    let losses = transfer.losses()?;
    let diverged = match (diverged, divergence_at_end(&history, losses.total)) {
        (None, Some(what)) => Some(diverged_or_error(opts, lr, what)?),
        (earlier, _) => earlier,
    };
    write_png(transfer.image(), &opts.out, PngDepth::Eight)?;
    let shape = transfer.image().shape().to_vec();
    Ok(StyleReport {
        model: opts.net.name.clone(),
        random_init: opts.weights.is_none(),
        optimizer: opts.optimizer,
        lr,
        input_convention: opts.input_convention,
        init: opts.init,
        steps: opts.steps,
        height: shape[2],
        width: shape[3],
        device: device.to_string(),
        content_weight: opts.content_weight,
        style_weight: opts.style_weight,
        losses,
        history,
        diverged,
        written: opts.out.clone(),
        frames,
        memory: StepBytes {
            measured_peak_bytes: ledger.peak(device),
            ..memory
        },
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The optimisation problem of `opts` on its device: the VGG (with its
/// weights), the targets of `content` and `style`, the starting image.
fn problem(opts: &StyleOptions, content: Tensor, style: Tensor) -> Result<Transfer> {
    let device = opts.device;
    let vgg = Vgg::new(&opts.net.config, DType::F32, device, opts.seed)?;
    if let Some(path) = &opts.weights {
        load_vgg_features(&vgg, path)?;
    }
    let (content, style) = (content.to_device(device)?, style.to_device(device)?);
    let init = match opts.init {
        StyleInit::Content => content.clone(),
        StyleInit::Noise => Tensor::rand(content.shape(), DType::F32, device, opts.seed)?,
    };
    let weights = (opts.content_weight, opts.style_weight);
    let images = (&content, &style);
    Transfer::with_input(
        vgg,
        &opts.net,
        images,
        &init,
        weights,
        opts.input_convention,
    )
}

/// What the optimisation left besides the image.
struct Optimised {
    history: Vec<f64>,
    frames: Vec<PathBuf>,
    diverged: Option<String>,
}

/// The steps of `opts.optimizer` at learning rate `lr`: each step's loss
/// recorded and checked for divergence (an error unless
/// `opts.keep_going`), frames written every `opts.every` steps.
fn optimise(
    opts: &StyleOptions,
    transfer: &Transfer,
    lr: f64,
    progress: &Progress,
) -> Result<Optimised> {
    let mut done = Optimised {
        history: Vec::new(),
        frames: Vec::new(),
        diverged: None,
    };
    // After each step's evaluation (`loss`, before its update) and update.
    let mut record = |step: usize, loss: f64| -> Result<()> {
        done.history.push(loss);
        progress.step(loss);
        if done.diverged.is_none() {
            if let Some(what) = divergence(&done.history) {
                done.diverged = Some(diverged_or_error(opts, lr, what)?);
            }
        }
        if opts.every.is_some_and(|n| step.is_multiple_of(n)) {
            let path = frame_path(&opts.out, step);
            write_png(transfer.image(), &path, PngDepth::Eight)?;
            done.frames.push(path);
        }
        Ok(())
    };
    match opts.optimizer {
        StyleOptimizer::Adam => {
            let mut adam = Optimizer::new([transfer.image().clone()], Adam::new(lr))?;
            for step in 1..=opts.steps {
                let loss = transfer.evaluate()?.total;
                adam.step()?;
                adam.zero_grad();
                transfer.clamp_image()?;
                record(step, loss)?;
            }
        }
        StyleOptimizer::Lbfgs => {
            let options = LbfgsOptions::new(lr).max_iter(1);
            let mut lbfgs = Lbfgs::new([transfer.image().clone()], options)?;
            for step in 1..=opts.steps {
                let loss = lbfgs.step(|| {
                    transfer.clamp_image()?;
                    Ok(transfer.evaluate()?.total)
                })?;
                record(step, loss)?;
            }
        }
    }
    Ok(done)
}

/// How far above the first step's loss the loss may stay before the run
/// counts as diverged (see [`divergence`]).
pub const DIVERGENCE_FACTOR: f64 = 10.0;

/// How many steps in a row the loss must stay above [`DIVERGENCE_FACTOR`]
/// times the first step's for the run to stop early.
pub const DIVERGENCE_STEPS: usize = 10;

/// Whether the losses of the steps so far (`history`, each step's loss
/// before its update) say the optimisation diverged, and how: the latest
/// loss is not finite, or the last [`DIVERGENCE_STEPS`] steps' losses
/// (the first step's not among them) are all above [`DIVERGENCE_FACTOR`]
/// times the first step's. L-BFGS without a line search (PyTorch's, the
/// tutorial's) may jump up tens of times for a few steps and come back
/// down (from noise on a random VGG: 34× for 5 steps, then 10⁻⁴× the
/// start), so one high step is not divergence; a step size the problem
/// cannot take (lr 1 on Caffe-scaled weights read as torchvision's:
/// hundreds of times at once) keeps it there. [`divergence_at_end`]
/// judges the result.
pub fn divergence(history: &[f64]) -> Option<String> {
    let first = *history.first()?;
    let (step, last) = (history.len(), *history.last()?);
    if !last.is_finite() {
        return Some(format!("the loss became {last} at step {step}"));
    }
    let recent = history.get(1..)?.iter().rev().take(DIVERGENCE_STEPS);
    let high = recent.filter(|&&l| l > DIVERGENCE_FACTOR * first).count();
    (high == DIVERGENCE_STEPS).then(|| {
        format!(
            "the loss rose from {first:.4e} at step 1 to above {DIVERGENCE_FACTOR}× that for \
             {DIVERGENCE_STEPS} steps, {last:.4e} ({:.0}×) at step {step}: the image is turning \
             into noise",
            last / first
        )
    })
}

/// Whether the result's loss `last` (after every step of `history`) says
/// the run diverged: not finite, or above [`DIVERGENCE_FACTOR`] times the
/// first step's loss (a result ten times worse than where it started).
pub fn divergence_at_end(history: &[f64], last: f64) -> Option<String> {
    let first = *history.first()?;
    if !last.is_finite() {
        return Some(format!("the result's loss is {last}"));
    }
    (last > DIVERGENCE_FACTOR * first).then(|| {
        format!(
            "the loss rose from {first:.4e} at step 1 to {last:.4e} for the result, {:.0}× \
             (more than {DIVERGENCE_FACTOR}×): the image is noise",
            last / first
        )
    })
}

/// A divergence (`what` happened) of a run of `opts` at learning rate
/// `lr`: [`Error::Diverged`] saying what to try, or, with
/// `opts.keep_going`, the same text for the report.
fn diverged_or_error(opts: &StyleOptions, lr: f64, what: String) -> Result<String> {
    let reason = format!("{what}; {}", divergence_hint(opts, lr));
    if opts.keep_going {
        Ok(reason)
    } else {
        Err(Error::Diverged {
            job: "style",
            reason,
        })
    }
}

/// What to try when a run of `opts` at learning rate `lr` diverges.
fn divergence_hint(opts: &StyleOptions, lr: f64) -> String {
    let mut tries = vec![format!("a lower learning rate (--lr, now {lr})")];
    if opts.optimizer == StyleOptimizer::Lbfgs {
        tries.push("--optimizer adam".into());
    }
    if opts.input_convention == InputConvention::Torchvision {
        tries.push(
            "--input-convention caffe if the weights are Caffe's (BGR, 0–255, mean-subtracted)"
                .into(),
        );
    }
    format!(
        "try {}; --keep-going runs on regardless",
        tries.join(", or ")
    )
}

fn check(opts: &StyleOptions) -> Result<()> {
    let bad = |msg: String| Err(Error::InvalidArgument { op: "style", msg });
    if opts.size == 0 || opts.steps == 0 {
        return bad("size and steps must be at least 1".into());
    }
    if opts.every == Some(0) {
        return bad("every must be at least 1".into());
    }
    for (what, w) in [
        ("content weight", opts.content_weight),
        ("style weight", opts.style_weight),
    ] {
        if !(w.is_finite() && w >= 0.0) {
            return bad(format!("{what} must be a number ≥ 0, not {w}"));
        }
    }
    if let Some(lr) = opts.lr.filter(|lr| !(lr.is_finite() && *lr > 0.0)) {
        return bad(format!("lr must be a positive number, not {lr}"));
    }
    Ok(())
}

/// `path` read as RGB in [0, 1], its shorter side resized to `size`
/// (aspect kept), as `[1, 3, H, W]` on the CPU. The resize's memory is
/// checked from the header before the image is decoded.
pub fn read_resized(path: &Path, size: usize) -> Result<Tensor> {
    let resize = Resize::shorter(size);
    let image = read_image_with(path, ColorMode::Rgb, &resize, &mut SampleRng::new(0))?;
    image.unsqueeze(0)
}

/// The `[1, 3, H, W]` shape [`read_resized`] gives `path` at `size`, from
/// the file's header alone (nothing decoded). [`Error::Image`] naming the
/// file when the resized image alone is more than the host can hold.
pub fn resized_shape(path: &Path, size: usize) -> Result<Vec<usize>> {
    let header = read_image_header(path)?;
    let (h, w) = ResizeTo::Shorter(size).output_size(header.height, header.width);
    let fits = checked_count(&[3, h, w, 4]).ok().is_some_and(|bytes| {
        crate::memory::host::host_available_bytes().is_none_or(|a| bytes <= a)
    });
    if !fits {
        return Err(Error::Image {
            path: path.to_path_buf(),
            reason: format!(
                "its {}×{} pixels resized to a shorter side of {size} are {h}×{w}, \
                 more than the host can hold",
                header.height, header.width
            ),
        });
    }
    Ok(vec![1, 3, h, w])
}

/// Every file a run of `opts` writes: the result, then its frames.
pub fn outputs(opts: &StyleOptions) -> impl Iterator<Item = PathBuf> + '_ {
    let frames = opts
        .every
        .filter(|&n| n > 0)
        .map(|n| (n..=opts.steps).step_by(n))
        .into_iter()
        .flatten();
    std::iter::once(opts.out.clone()).chain(frames.map(|step| frame_path(&opts.out, step)))
}

/// The frame of step `step`: `OUT-000100.png` next to `OUT.png`.
pub fn frame_path(out: &Path, step: usize) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or("style".into(), |s| s.to_string_lossy());
    out.with_file_name(format!("{stem}-{step:06}.png"))
}

/// One step on the meta device (the VGG, the targets, the image and its
/// gradient), under the lean policy and under PyTorch's, each in a fresh
/// ledger.
fn predict_memory(opts: &StyleOptions, content: &[usize], style: &[usize]) -> Result<StepBytes> {
    let peak = |policy: SavePolicy| -> Result<usize> {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let vgg = Vgg::new(&opts.net.config, DType::F32, Device::Meta, 0)?;
        let c = Tensor::zeros(content, DType::F32, Device::Meta)?;
        let s = Tensor::zeros(style, DType::F32, Device::Meta)?;
        let input = opts.input_convention;
        let transfer = Transfer::with_input(vgg, &opts.net, (&c, &s), &c, (1.0, 1.0), input)?;
        drop((c, s));
        let _p = with_save_policy(policy);
        drop(transfer.backward()?);
        Ok(ledger.peak(Device::Meta))
    };
    Ok(StepBytes {
        lean_step_bytes: peak(SavePolicy::Lean)?,
        pytorch_step_bytes: peak(SavePolicy::SaveAll)?,
        measured_peak_bytes: 0,
    })
}

/// A few lines for people: losses, time, memory.
pub fn describe(r: &StyleReport) -> String {
    let mut s = String::new();
    if r.random_init {
        s += "note: no --weights given: the VGG is randomly initialised\n";
    }
    s += &format!(
        "{} on {}: {}×{} image, {} {} steps (lr {}) in {:.1} s, written to {}\n",
        r.model,
        r.device,
        r.height,
        r.width,
        r.steps,
        r.optimizer,
        r.lr,
        r.seconds,
        r.written.display()
    );
    if r.input_convention == InputConvention::Caffe {
        s += "input as Caffe's weights expect it: BGR, 0–255, mean subtracted\n";
    }
    if !r.frames.is_empty() {
        s += &format!("{} frames written next to it\n", r.frames.len());
    }
    let first = r.history.first().copied().unwrap_or(f64::NAN);
    s += &format!(
        "loss: content {:.4e}  style {:.4e}  total {:.4e} (first step {:.4e})\n",
        r.losses.content, r.losses.style, r.losses.total, first
    );
    s += &r.memory.describe("step");
    s
}
