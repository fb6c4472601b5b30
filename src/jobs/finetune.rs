//! Fine-tuning an image classifier on a folder of images: the model's head
//! is replaced to match the folder's classes, the backbone is frozen by a
//! named case (default `linear-bn-eval`: only Linear layers train, every
//! BatchNorm in evaluation mode), and the rest trains with SGD, Adam or
//! AdamW, optionally with the update fused into backward. Each epoch
//! reports the training loss and accuracy and, with a validation folder,
//! the validation accuracy; a checkpoint (model, optimizer, progress) is
//! written after every epoch and a run resumes from one bit for bit.
//!
//! Data parallel (under `leangrad launch` or torchrun, or with
//! [`FinetuneOptions::distributed`]): each rank trains on its shard of
//! every epoch ([`DistributedSampler`], seeded by `seed`) with `batch`
//! images per rank, the gradients averaged over the ranks
//! ([`DataParallel`]); losses and accuracies are over all ranks' images,
//! validation runs whole on every rank, and rank 0 alone prints progress
//! and writes checkpoints, which resume on any number of ranks.
//!
//! Training images get torchvision's `RandomResizedCrop(size)` and
//! `RandomHorizontalFlip()`, validation images `Resize(size·256/224)` and
//! `CenterCrop(size)`; both are normalised with ImageNet's mean and std.

use super::{
    image_model, image_model_with, ImageClassifier, Progress, StepBytes, WeightsLoading,
    WeightsNote,
};
use crate::autograd::{no_grad, SavePolicy};
use crate::data::{
    CenterCrop, Compose, DataLoader, DistributedSampler, ImageFolder, Normalize,
    RandomHorizontalFlip, RandomResizedCrop, Resize,
};
use crate::distributed::{
    convert_sync_batchnorm, DataParallel, DdpOptions, InitOptions, ProcessGroup, ReduceOp,
};
use crate::io::{state_dict, Checkpoint};
use crate::memory::Ledger;
use crate::memory_plan::{parse_case, run_step, OptimizerKind, StepInput, StepModel, StepSpec};
use crate::models::Case;
use crate::ops::CrossEntropyOptions;
use crate::optim::{Adam, Algorithm, CheckpointHyper, Optimizer, Sgd, StateFormat};
use crate::{DType, Device, Error, Result, Tensor};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// What [`run`] does; [`FinetuneOptions::new`] gives the defaults of the
/// `leangrad finetune` command.
#[derive(Clone, Debug)]
pub struct FinetuneOptions {
    /// The model (one of [`super::CLASSIFIERS`]).
    pub model: String,
    /// A safetensors file of the torchvision model's `state_dict()` (or of
    /// its backbone); `None` trains from a random initialisation (and says
    /// so).
    pub weights: Option<PathBuf>,
    /// How the weights file is read (strictness, prefixes).
    pub loading: WeightsLoading,
    /// The training images, one sub-folder per class (ImageFolder).
    pub data: PathBuf,
    /// Validation images with the same class folders.
    pub val: Option<PathBuf>,
    /// Which parameters train and whether BatchNorm is in evaluation mode.
    pub case: String,
    /// Passes over the training images.
    pub epochs: usize,
    /// Images per step.
    pub batch: usize,
    /// Image height and width.
    pub size: usize,
    /// Learning rate.
    pub lr: f64,
    /// The optimizer (SGD has momentum 0.9).
    pub optimizer: OptimizerKind,
    /// Update each parameter inside backward, as soon as its gradient is
    /// final (`Optimizer::backward_step`).
    pub fused: bool,
    /// Each residual block of the model a checkpointed segment (activation
    /// checkpointing: forward keeps each block's input, backward runs the
    /// block again); an error for a model without blocks.
    pub gradient_checkpointing: bool,
    /// Under a group, BatchNorm layers in training mode normalise with
    /// statistics over all ranks' batches (`SyncBatchNorm`,
    /// [`convert_sync_batchnorm`]); without one it changes nothing.
    pub sync_batch_norm: bool,
    /// How Adam keeps its moments (f32, bf16 or block-wise 8-bit;
    /// [`Optimizer::set_state_format`]).
    pub optimizer_state: StateFormat,
    /// The training forward under [`crate::autocast`] in this dtype (bf16
    /// or f16), or in f32 (`None`).
    pub autocast: Option<DType>,
    /// The checkpoint folder written after every epoch.
    pub out: Option<PathBuf>,
    /// A checkpoint folder to resume from.
    pub resume: Option<PathBuf>,
    /// Where to train.
    pub device: Device,
    /// Seed of the shuffling and the random transforms.
    pub seed: u64,
    /// Threads decoding images ahead of the training step.
    pub workers: usize,
    /// Leave out images that cannot be read (one warning per file) instead
    /// of stopping at the first with [`Error::Image`] naming it.
    pub skip_bad_images: bool,
    /// No progress bar.
    pub quiet: bool,
    /// Train data parallel as this rank of this group (`device` must be
    /// its device); `None`: one process.
    pub distributed: Option<InitOptions>,
}

impl FinetuneOptions {
    /// The head only (`linear-bn-eval`) with SGD (lr 0.01, momentum 0.9),
    /// one epoch of batches of 32 images of 224², two decoding threads,
    /// on the CPU.
    pub fn new(model: &str, data: impl Into<PathBuf>) -> Self {
        FinetuneOptions {
            model: model.to_string(),
            weights: None,
            loading: WeightsLoading::default(),
            data: data.into(),
            val: None,
            case: "linear-bn-eval".into(),
            epochs: 1,
            batch: 32,
            size: 224,
            lr: 0.01,
            optimizer: OptimizerKind::Sgd,
            fused: false,
            gradient_checkpointing: false,
            sync_batch_norm: false,
            optimizer_state: StateFormat::Full,
            autocast: None,
            out: None,
            resume: None,
            device: Device::Cpu,
            seed: 0,
            workers: 2,
            skip_bad_images: false,
            quiet: true,
            distributed: None,
        }
    }
}

/// One epoch's numbers.
#[derive(Clone, Debug, Serialize)]
pub struct EpochResult {
    /// The epoch (from 0).
    pub epoch: usize,
    /// Mean training loss over the epoch's batches.
    pub train_loss: f64,
    /// Training accuracy (of the predictions made while training).
    pub train_accuracy: f64,
    /// Validation accuracy, with a validation folder.
    pub val_accuracy: Option<f64>,
    /// Training images per second.
    pub images_per_second: f64,
}

/// The outcome of [`run`].
#[derive(Clone, Debug, Serialize)]
pub struct FinetuneReport {
    /// The model.
    pub model: String,
    /// Whether it started from a random initialisation.
    pub random_init: bool,
    /// What the weights file gave the model.
    pub weights: Option<WeightsNote>,
    /// The classes (sub-folder names, in index order).
    pub classes: Vec<String>,
    /// The case.
    pub case: String,
    /// How the optimizer kept its state (`f32`, `bf16`, `8bit`).
    pub optimizer_state: StateFormat,
    /// The training forward's autocast dtype (`bf16`, `f16`), if any.
    pub autocast: Option<String>,
    /// Parameters trained / in the model.
    pub trainable_parameters: usize,
    /// All parameters.
    pub parameters: usize,
    /// Where it ran.
    pub device: String,
    /// The epoch it started from (0, or the resumed checkpoint's next).
    pub first_epoch: usize,
    /// Each epoch run.
    pub epochs: Vec<EpochResult>,
    /// Memory (of this rank, under data parallel).
    pub memory: StepBytes,
    /// The ranks that trained (1 without data parallel).
    pub world_size: usize,
    /// Each rank's measured peak bytes, in rank order.
    pub peak_bytes_per_rank: Vec<usize>,
    /// The checkpoint written last.
    pub checkpoint: Option<PathBuf>,
}

/// Fine-tunes as `opts` says.
pub fn run(opts: &FinetuneOptions) -> Result<FinetuneReport> {
    if opts.batch == 0 || opts.size == 0 || opts.epochs == 0 {
        return Err(Error::InvalidArgument {
            op: "finetune",
            msg: "batch, size and epochs must be at least 1".into(),
        });
    }
    if opts.workers > crate::data::MAX_WORKERS {
        return Err(Error::InvalidArgument {
            op: "finetune",
            msg: format!(
                "{} workers asked for; at most {}",
                opts.workers,
                crate::data::MAX_WORKERS
            ),
        });
    }
    if !(opts.lr.is_finite() && opts.lr > 0.0) {
        return Err(Error::InvalidArgument {
            op: "finetune",
            msg: format!(
                "the learning rate must be a positive number, not {}",
                opts.lr
            ),
        });
    }
    if let Some(out) = &opts.out {
        // A wrong --out is refused now, not after the first epoch.
        Checkpoint::check_destination(out)?;
    }
    let case = parse_case(&opts.case)?;
    let train = ImageFolder::new(&opts.data)?.with_transform(
        Compose::new()
            .then(RandomResizedCrop::new(opts.size))
            .then(RandomHorizontalFlip::default())
            .then(Normalize::imagenet()),
    );
    let classes = train.classes().to_vec();
    let val = match &opts.val {
        Some(dir) => {
            let v = ImageFolder::new(dir)?.with_transform(
                Compose::new()
                    .then(Resize::shorter(opts.size * 256 / 224))
                    .then(CenterCrop::square(opts.size))
                    .then(Normalize::imagenet()),
            );
            if v.classes() != classes.as_slice() {
                return Err(Error::Image {
                    path: dir.clone(),
                    reason: format!(
                        "its class folders {:?} differ from the training folders {:?}",
                        v.classes(),
                        classes
                    ),
                });
            }
            Some(v)
        }
        None => None,
    };
    let memory = predict_step(opts, case, classes.len())?;
    memory.check_fits(opts.device, "training step")?;
    let group = join_group(opts)?;
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let loaded = image_model_with(
        &opts.model,
        opts.weights.as_deref(),
        &opts.loading,
        classes.len(),
        opts.device,
    )?;
    let mut model = loaded.model;
    case.apply(model.as_mut())?;
    if opts.gradient_checkpointing {
        model.set_gradient_checkpointing(true)?;
    }
    if let Some(g) = group.as_ref().filter(|_| opts.sync_batch_norm) {
        convert_sync_batchnorm(model.as_mut(), g);
    }
    let all = model.parameters();
    let params: Vec<Tensor> = all.iter().filter(|p| p.requires_grad()).cloned().collect();
    if params.is_empty() {
        return Err(Error::InvalidArgument {
            op: "finetune",
            msg: format!("case `{}` trains no parameter of {}", opts.case, opts.model),
        });
    }
    let parallel = match &group {
        Some(g) => Some(DataParallel::new(
            model.as_ref(),
            g.clone(),
            DdpOptions::default(),
        )?),
        None => None,
    };
    let train = match &group {
        Some(g) => DataLoader::new(train, opts.batch)?
            .sampler(DistributedSampler::new(g.world_size(), g.rank())?.seed(opts.seed))?,
        None => DataLoader::new(train, opts.batch)?.shuffle(true),
    };
    let job = Job {
        opts,
        case,
        model: model.as_mut(),
        parallel: parallel.as_ref(),
        train: train
            .seed(opts.seed)
            .workers(opts.workers)
            .skip_bad_files(opts.skip_bad_images)
            .device(opts.device),
        val: val
            .map(|v| {
                DataLoader::new(v, opts.batch).map(|l| {
                    l.workers(opts.workers)
                        .skip_bad_files(opts.skip_bad_images)
                        .device(opts.device)
                })
            })
            .transpose()?,
        ledger: &ledger,
    };
    let optimizer = |alg| -> Result<Optimizer<_>> {
        let mut opt = Optimizer::new(params.clone(), alg)?;
        opt.set_state_format(opts.optimizer_state)?;
        Ok(opt)
    };
    let (first_epoch, epochs, checkpoint) = match opts.optimizer {
        OptimizerKind::Sgd => {
            let mut opt = Optimizer::new(params.clone(), Sgd::new(opts.lr).momentum(0.9))?;
            opt.set_state_format(opts.optimizer_state)?;
            job.train(opt)?
        }
        OptimizerKind::Adam => job.train(optimizer(Adam::new(opts.lr))?)?,
        OptimizerKind::Adamw => job.train(optimizer(Adam::adamw(opts.lr))?)?,
    };
    Ok(FinetuneReport {
        model: opts.model.clone(),
        random_init: opts.weights.is_none(),
        weights: loaded.weights,
        classes,
        case: opts.case.clone(),
        optimizer_state: opts.optimizer_state,
        autocast: opts.autocast.map(|d| format!("{d:?}").to_lowercase()),
        trainable_parameters: params.iter().map(Tensor::numel).sum(),
        parameters: all.iter().map(Tensor::numel).sum(),
        device: opts.device.to_string(),
        first_epoch,
        epochs,
        memory: StepBytes {
            measured_peak_bytes: ledger.peak(opts.device),
            ..memory
        },
        world_size: group.as_ref().map_or(1, |g| g.world_size()),
        peak_bytes_per_rank: peaks_per_rank(group.as_deref(), ledger.peak(opts.device))?,
        checkpoint,
    })
}

/// The group of [`FinetuneOptions::distributed`], joined, on `device`.
fn join_group(opts: &FinetuneOptions) -> Result<Option<Arc<ProcessGroup>>> {
    let Some(init) = &opts.distributed else {
        return Ok(None);
    };
    if init.device != opts.device {
        return Err(Error::InvalidArgument {
            op: "finetune",
            msg: format!(
                "rank {} computes on {:?}, but the job was given {:?}",
                init.rank, init.device, opts.device
            ),
        });
    }
    Ok(Some(Arc::new(init.init()?)))
}

/// Every rank's `peak`, in rank order (this one's alone without a group).
fn peaks_per_rank(group: Option<&ProcessGroup>, peak: usize) -> Result<Vec<usize>> {
    let Some(g) = group else {
        return Ok(vec![peak]);
    };
    let mine = Tensor::from_vec(vec![peak as i64], &[1], g.device())?;
    let all: Vec<i64> = g.all_gather(&mine)?.to_vec()?;
    Ok(all.into_iter().map(|b| b.max(0) as usize).collect())
}

/// Sums over the ranks (as they are without a group).
fn sum_over_ranks(parallel: Option<&DataParallel>, values: [f64; 4]) -> Result<[f64; 4]> {
    let Some(p) = parallel else {
        return Ok(values);
    };
    let t = Tensor::from_vec(values.to_vec(), &[4], p.group().device())?;
    p.group().all_reduce(&t, ReduceOp::Sum)?;
    let v: Vec<f64> = t.to_vec()?;
    Ok([v[0], v[1], v[2], v[3]])
}

/// One step of the same model, case, batch and optimizer on the meta
/// device under both policies.
fn predict_step(opts: &FinetuneOptions, case: Case, classes: usize) -> Result<StepBytes> {
    let spec = StepSpec {
        batch: opts.batch,
        input: StepInput::Image {
            channels: 3,
            size: opts.size,
        },
        classes,
        dtype: DType::F32,
        optimizer: opts.optimizer,
        fused: opts.fused,
        checkpoint: opts.gradient_checkpointing,
        optimizer_state: opts.optimizer_state,
        autocast: opts.autocast,
        case,
        device: Device::Meta,
    };
    let name = opts.model.clone();
    let build = move |_: DType, device: Device| -> Result<Box<dyn StepModel>> {
        Ok(image_model(&name, None, classes, device)?)
    };
    let peak = |policy| run_step(&build, &spec, policy).map(|m| m.report.peak_total);
    Ok(StepBytes {
        lean_step_bytes: peak(SavePolicy::Lean)?,
        pytorch_step_bytes: peak(SavePolicy::SaveAll)?,
        measured_peak_bytes: 0,
    })
}

/// The training run's parts.
struct Job<'a> {
    opts: &'a FinetuneOptions,
    case: Case,
    model: &'a mut dyn ImageClassifier,
    /// Data parallel's gradient averaging, under a group.
    parallel: Option<&'a DataParallel>,
    train: DataLoader<ImageFolder>,
    val: Option<DataLoader<ImageFolder>>,
    ledger: &'a Ledger,
}

impl Job<'_> {
    /// Every epoch, from the resumed one; returns the first epoch, the
    /// epochs' results and the last checkpoint written.
    fn train<A: Algorithm + CheckpointHyper>(
        mut self,
        mut opt: Optimizer<A>,
    ) -> Result<(usize, Vec<EpochResult>, Option<PathBuf>)> {
        let mut first = 0;
        if let Some(dir) = &self.opts.resume {
            let ckpt = Checkpoint::load(dir)?;
            ckpt.restore(&state_dict(&*self.model, ""), &mut opt, None)?;
            // Counts were checked on loading (at most 2^53), so this fits.
            first = usize::try_from(ckpt.progress.epoch + 1).map_err(|_| Error::Checkpoint {
                entry: dir.display().to_string(),
                reason: format!("epoch {} is too large", ckpt.progress.epoch),
            })?;
            if first >= self.opts.epochs {
                return Err(Error::InvalidArgument {
                    op: "finetune",
                    msg: format!(
                        "{} already holds epoch {} of 0..{}: nothing is left to train (give more --epochs)",
                        dir.display(),
                        ckpt.progress.epoch,
                        self.opts.epochs
                    ),
                });
            }
        }
        let mut results = Vec::new();
        let mut written = None;
        for epoch in first..self.opts.epochs {
            results.push(self.epoch(epoch, &mut opt)?);
            if !self.is_rank0() {
                continue;
            }
            if let Some(dir) = &self.opts.out {
                let steps = (epoch as u64 + 1)
                    .checked_mul(self.train.num_batches() as u64)
                    .ok_or_else(|| Error::InvalidArgument {
                        op: "finetune",
                        msg: "the step count passes u64::MAX".into(),
                    })?;
                Checkpoint::capture(&state_dict(&*self.model, ""), &opt, None)?
                    .with_progress(epoch as u64, steps)
                    .with_metadata("model", self.opts.model.as_str())
                    .save(dir)?;
                written = Some(dir.clone());
            }
        }
        Ok((first, results, written))
    }

    /// Whether this process prints and writes (rank 0, or no group).
    fn is_rank0(&self) -> bool {
        self.parallel.is_none_or(|p| p.group().rank() == 0)
    }

    fn epoch<A: Algorithm>(&mut self, epoch: usize, opt: &mut Optimizer<A>) -> Result<EpochResult> {
        let progress = Progress::new(
            self.train.num_batches() as u64,
            &format!("epoch {epoch}"),
            self.ledger,
            self.opts.device,
            self.opts.quiet || !self.is_rank0(),
        );
        let start = Instant::now();
        let (mut loss_sum, mut batches, mut right, mut seen) = (0.0, 0usize, 0usize, 0usize);
        for batch in self.train.epoch(epoch as u64) {
            let batch = batch?;
            if let Some(p) = self.parallel.filter(|_| self.case.training()) {
                // Rank 0's running statistics on every rank, as DDP's
                // broadcast_buffers.
                p.broadcast_buffers(&*self.model)?;
            }
            let (logits, loss) = {
                let _autocast = self.opts.autocast.map(crate::autocast).transpose()?;
                let logits = self.model.step_logits(&batch.images)?;
                let loss = logits.cross_entropy(&batch.labels, CrossEntropyOptions::default())?;
                (logits, loss)
            };
            right += correct(&logits, &batch.labels)?;
            seen += batch.indices.len();
            let value = loss.to_scalar()?;
            match (self.parallel, self.opts.fused) {
                (None, true) => {
                    opt.backward_step(&loss)?;
                }
                (Some(p), true) => {
                    p.backward_step(opt, &loss)?;
                }
                (None, false) => loss.backward()?,
                (Some(p), false) => p.backward(&loss)?,
            }
            if !self.opts.fused {
                opt.step()?;
                opt.zero_grad();
            }
            loss_sum += value;
            batches += 1;
            progress.step(value);
        }
        progress.finish();
        let [loss_sum, batches, right, seen] = sum_over_ranks(
            self.parallel,
            [loss_sum, batches as f64, right as f64, seen as f64],
        )?;
        let seconds = start.elapsed().as_secs_f64();
        let val_accuracy = self.validate()?;
        Ok(EpochResult {
            epoch,
            train_loss: loss_sum / batches.max(1.0),
            train_accuracy: right / seen.max(1.0),
            val_accuracy,
            images_per_second: seen / seconds.max(1e-9),
        })
    }

    /// Accuracy on the validation images, every layer in evaluation mode.
    fn validate(&mut self) -> Result<Option<f64>> {
        let Some(val) = &self.val else {
            return Ok(None);
        };
        self.model.set_training(false);
        let _g = no_grad();
        let (mut right, mut seen) = (0, 0);
        for batch in val.epoch(0) {
            let batch = batch?;
            right += correct(&self.model.step_logits(&batch.images)?, &batch.labels)?;
            seen += batch.indices.len();
        }
        // Back to the case's modes (BatchNorm in evaluation mode or not).
        self.model.set_training(self.case.training());
        Ok(Some(right as f64 / seen.max(1) as f64))
    }
}

/// How many rows of `logits` have their largest value at the label.
fn correct(logits: &Tensor, labels: &Tensor) -> Result<usize> {
    let predicted = logits.detach().argmax(1, false)?.to_vec::<i64>()?;
    let labels = labels.to_vec::<i64>()?;
    Ok(predicted
        .iter()
        .zip(&labels)
        .filter(|(p, l)| p == l)
        .count())
}

/// A few lines for people: per-epoch numbers, memory, checkpoint.
pub fn describe(r: &FinetuneReport) -> String {
    let mut s = String::new();
    if r.random_init {
        s += "note: no --weights given: the model starts from a random initialisation\n";
    }
    if let Some(w) = &r.weights {
        s += &w.describe();
    }
    s += &format!(
        "{} on {}: {} classes, case {} trains {} of {} parameters\n",
        r.model,
        r.device,
        r.classes.len(),
        r.case,
        r.trainable_parameters,
        r.parameters
    );
    for e in &r.epochs {
        s += &format!(
            "epoch {:>3}  loss {:.4}  train accuracy {:.1}%{}  {:.1} images/s\n",
            e.epoch,
            e.train_loss,
            100.0 * e.train_accuracy,
            e.val_accuracy.map_or(String::new(), |v| format!(
                "  val accuracy {:.1}%",
                100.0 * v
            )),
            e.images_per_second
        );
    }
    s += &r.memory.describe("training step");
    if r.world_size > 1 {
        let peaks: Vec<String> = r
            .peak_bytes_per_rank
            .iter()
            .map(|&b| crate::memory::human_bytes(b))
            .collect();
        s += &format!(
            "data parallel over {} ranks: measured peak per rank {}\n",
            r.world_size,
            peaks.join(", ")
        );
    }
    if let Some(c) = &r.checkpoint {
        s += &format!("checkpoint: {}\n", c.display());
    }
    s
}
