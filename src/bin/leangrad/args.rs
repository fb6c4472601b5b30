//! The command line's arguments (clap), one variant per subcommand.

use clap::{Parser, Subcommand};
use leangrad::memory_plan::MODELS;
use leangrad::models::Case;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "leangrad",
    version,
    about = "A deep-learning framework whose autodiff keeps only the bytes gradients need"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Train a small MLP on a synthetic spiral (on CUDA 0 when present,
    /// else the CPU) and print the memory ledger.
    Demo {
        /// `auto`: CUDA 0 when it can be opened, else the CPU.
        #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda"])]
        device: String,
        /// Optimisation steps.
        #[arg(long, default_value_t = 300)]
        steps: usize,
        /// Hidden width.
        #[arg(long, default_value_t = 64)]
        hidden: usize,
        /// Points per class.
        #[arg(long, default_value_t = 100)]
        points: usize,
        /// Learning rate.
        #[arg(long, default_value_t = 0.5)]
        lr: f64,
        /// Print the ledger as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Predict (on the meta device, default) or measure (on the CPU) the
    /// memory of one training step, lean policy next to what PyTorch's
    /// autograd keeps.
    Memory(MemoryArgs),
    /// Start one process per GPU for data-parallel training, as torchrun:
    /// each runs the command after `--` with RANK, WORLD_SIZE, LOCAL_RANK,
    /// LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; when one fails the
    /// others are stopped and its exit code is returned.
    Launch(LaunchArgs),
    /// Fine-tune an image classifier on a folder of images (one sub-folder
    /// per class): the head is replaced to match the classes, the backbone
    /// frozen by the case; prints per-epoch loss and accuracy and the step's
    /// memory next to what PyTorch keeps, and writes a checkpoint.
    Finetune {
        /// The model: resnet18, resnet50, resnet101, resnext101_64x4d, vgg16, vgg16_bn, vgg19,
        /// vgg19_bn, mobilenet_v2, mobilenet_v3_large, efficientnet_v2_s, efficientnet_v2_m,
        /// efficientnet_v2_l, alexnet, convnext_tiny, convnext_small, convnext_base, convnext_large.
        #[arg(long, default_value = "resnet18")]
        model: String,
        /// A safetensors or PyTorch `.pt`/`.pth` file of the torchvision model's `state_dict()`, or
        /// of its backbone alone (the classifier then starts fresh); without
        /// it the model starts from a random initialisation.
        #[arg(long)]
        weights: Option<PathBuf>,
        /// `false`: load the names that line up; the model's names missing
        /// from the file keep their random initialisation and the file's
        /// other names are ignored (both listed). Shapes must match either
        /// way.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        strict: bool,
        /// Remove this prefix from the file's names where present
        /// (`module.` from a DistributedDataParallel checkpoint, `backbone.`).
        #[arg(long, default_value = "")]
        strip_prefix: String,
        /// Put this prefix in front of the file's names (after stripping).
        #[arg(long, default_value = "")]
        add_prefix: String,
        /// Training images, one sub-folder per class.
        #[arg(long)]
        data: PathBuf,
        /// Validation images, the same class sub-folders.
        #[arg(long)]
        val: Option<PathBuf>,
        /// Which parameters train (`linear-bn-eval`: the head only, every
        /// BatchNorm in evaluation mode).
        #[arg(long, default_value = "linear-bn-eval", value_parser = clap::builder::PossibleValuesParser::new(Case::all_names()))]
        case: String,
        /// Passes over the training images.
        #[arg(long, default_value_t = 1)]
        epochs: usize,
        /// Images per step.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Image size.
        #[arg(long, default_value_t = 224)]
        size: usize,
        /// Learning rate.
        #[arg(long, default_value_t = 0.01)]
        lr: f64,
        /// Optimizer (sgd has momentum 0.9).
        #[arg(long, default_value = "sgd", value_parser = ["sgd", "adam", "adamw"])]
        optimizer: String,
        /// Update each parameter inside backward as soon as its gradient is final.
        #[arg(long)]
        fused: bool,
        /// Activation checkpointing per residual block: forward keeps only
        /// each block's input and backward runs the block again (the saved
        /// training state is --out).
        #[arg(long = "checkpoint")]
        gradient_checkpointing: bool,
        /// Under `leangrad launch`: BatchNorm layers in training mode
        /// normalise with the statistics of all ranks' batches together
        /// (SyncBatchNorm) instead of each rank's own.
        #[arg(long = "sync-batchnorm")]
        sync_batch_norm: bool,
        /// How Adam keeps its two moments: f32, bf16 (half the bytes) or
        /// 8bit (block-wise quantised, a quarter).
        #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "8bit"])]
        optimizer_state: String,
        /// Mixed precision: products and convolutions in bf16 or f16,
        /// norms, softmax and the loss in f32, f32 weights and gradients.
        #[arg(long, value_parser = ["bf16", "f16"])]
        autocast: Option<String>,
        /// The checkpoint folder written after every epoch.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Resume from this checkpoint folder.
        #[arg(long)]
        resume: Option<PathBuf>,
        /// Seed of the shuffling and the random crops and flips.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Threads decoding images ahead of the step (at most 64).
        #[arg(long, default_value_t = 2, value_parser = parse_workers)]
        workers: usize,
        /// Leave out images that cannot be read (damaged, truncated, not an
        /// image, too large), with one warning per file, instead of stopping
        /// at the first with an error naming it.
        #[arg(long)]
        skip_bad_images: bool,
        /// `auto`: CUDA 0 when it can be opened, else the CPU.
        #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda"])]
        device: String,
        /// Write only JSON to stdout (no progress bar).
        #[arg(long)]
        json: bool,
    },
    /// Adversarial examples (FGSM, PGD, PGD-L2) against an image classifier
    /// with every parameter frozen: writes each adversarial image as PNG
    /// and prints clean vs adversarial accuracy, the success rate, the
    /// perturbation norms, the memory next to what PyTorch keeps, and each
    /// image's clean and adversarial prediction.
    Adversarial {
        /// The model (an image model of `leangrad memory`).
        #[arg(long, default_value = "resnet18")]
        model: String,
        /// A safetensors or PyTorch `.pt`/`.pth` file of the torchvision model's `state_dict()`
        /// (without it the model is randomly initialised).
        #[arg(long)]
        weights: Option<PathBuf>,
        /// The images: a folder of image files, or of sub-folders named by
        /// class index (`207/`), which then give the labels.
        #[arg(long)]
        images: PathBuf,
        /// `fgsm`, `pgd` (L∞) or `pgd-l2`.
        #[arg(long, default_value = "pgd", value_parser = ["fgsm", "pgd", "pgd-l2"])]
        attack: String,
        /// Perturbation bound, in pixel units ([0, 1]).
        #[arg(long, default_value_t = 8.0 / 255.0)]
        eps: f64,
        /// Step of the iterative attacks.
        #[arg(long, default_value_t = 2.0 / 255.0)]
        alpha: f64,
        /// Steps of the iterative attacks.
        #[arg(long, default_value_t = 10)]
        steps: usize,
        /// Push every image towards this class.
        #[arg(long)]
        targeted: Option<usize>,
        /// Image size (shorter side resized, then centre-cropped).
        #[arg(long, default_value_t = 224)]
        size: usize,
        /// Images attacked at once.
        #[arg(long, default_value_t = 8)]
        batch: usize,
        /// The classifier's classes.
        #[arg(long, default_value_t = 1000)]
        classes: usize,
        /// A file of the classes' names, one a line in class-index order
        /// (as many lines as --classes), shown next to the predictions.
        #[arg(long)]
        labels: Option<PathBuf>,
        /// Seed of PGD's random start.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// `auto`: CUDA 0 when it can be opened, else the CPU.
        #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda"])]
        device: String,
        /// Where the adversarial images are written.
        #[arg(long)]
        out: PathBuf,
        /// Leave out images that cannot be read (damaged, truncated, not an
        /// image, too large), with one warning per file, instead of stopping
        /// at the first with an error naming it.
        #[arg(long)]
        skip_bad_images: bool,
        /// Write only JSON to stdout (no progress bar).
        #[arg(long)]
        json: bool,
    },
    /// Neural style transfer (Gatys et al.): optimises an image so that
    /// its VGG features match the content image's and its Gram matrices the
    /// style image's; only the image gets a gradient. Writes OUT.png (and a
    /// frame every N steps) and prints the losses and the memory next to
    /// what PyTorch keeps.
    Style {
        /// The content image (PNG, JPEG or BMP).
        #[arg(long)]
        content: PathBuf,
        /// The style image.
        #[arg(long)]
        style: PathBuf,
        /// A safetensors or PyTorch `.pt`/`.pth` file of torchvision's VGG `state_dict()` (whole,
        /// or only its `features.*`); without it the VGG is randomly
        /// initialised.
        #[arg(long)]
        weights: Option<PathBuf>,
        /// The network.
        #[arg(long, default_value = "vgg19", value_parser = ["vgg19", "vgg16"])]
        model: String,
        /// Shorter side of both images (aspect kept).
        #[arg(long, default_value_t = 256)]
        size: usize,
        /// Steps (loss-and-gradient evaluations).
        #[arg(long, default_value_t = 300)]
        steps: usize,
        /// Weight of the content loss.
        #[arg(long, default_value_t = 1.0)]
        content_weight: f64,
        /// Weight of the style loss.
        #[arg(long, default_value_t = 1e6)]
        style_weight: f64,
        /// `lbfgs` or `adam`.
        #[arg(long, default_value = "lbfgs", value_parser = ["lbfgs", "adam"])]
        optimizer: String,
        /// Learning rate (default: 1 for lbfgs, 0.02 for adam).
        #[arg(long)]
        lr: Option<f64>,
        /// Start from the `content` image or from uniform `noise`.
        #[arg(long, default_value = "content", value_parser = ["content", "noise"])]
        init: String,
        /// Seed of the noise start and of the random VGG.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The result (PNG).
        #[arg(long)]
        out: PathBuf,
        /// Also write OUT-000100.png etc. every N steps.
        #[arg(long)]
        every: Option<usize>,
        /// How the VGG's input is made from the image: `torchvision`
        /// (RGB in [0, 1], ImageNet mean and std) or `caffe` (BGR, 0–255,
        /// mean [103.939, 116.779, 123.68] subtracted), as the weights were
        /// trained.
        #[arg(long, default_value = "torchvision", value_parser = ["torchvision", "caffe"])]
        input_convention: String,
        /// Run on when the loss diverges (non-finite, above 10× the first
        /// step's for 10 steps, or so for the result), with a warning,
        /// instead of stopping with an error.
        #[arg(long)]
        keep_going: bool,
        /// `auto`: CUDA 0 when it can be opened, else the CPU.
        #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda"])]
        device: String,
        /// Write only JSON to stdout (no progress bar).
        #[arg(long)]
        json: bool,
    },
}

/// The arguments of `leangrad launch`.
#[derive(clap::Args)]
pub struct LaunchArgs {
    /// Processes to start on this machine: one per GPU (each gets
    /// `LOCAL_RANK` = its GPU).
    #[arg(long)]
    pub nproc_per_node: usize,
    /// Machines in the job.
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// This machine's index among them (rank 0 runs on machine 0).
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Machine 0's address, where rank 0 listens.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Rank 0's port.
    #[arg(long, default_value_t = 29500)]
    pub master_port: u16,
    /// The command each process runs, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// The arguments of `leangrad memory`.
#[derive(clap::Args)]
pub struct MemoryArgs {
    /// The model (full size).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(MODELS.iter().map(|m| m.name)))]
    pub model: String,
    /// Samples (images or sequences) per batch.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    /// Which parameters train, whether the input (images, or a text
    /// model's input embeddings) needs a gradient, and `-bn-eval` for
    /// evaluation mode.
    #[arg(long, default_value = "all", value_parser = clap::builder::PossibleValuesParser::new(Case::all_names()))]
    pub case: String,
    /// Image height and width, for image models (default: the model's, 224).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub size: Option<u32>,
    /// Tokens per sequence, for text models (default 128).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub seq: Option<u32>,
    /// Classes of the classifier and the synthetic targets (default
    /// 1000; gpt2's and mistral_7b's classes are their vocabularies).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub classes: Option<u32>,
    /// Compute dtype.
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16", "bf16"])]
    pub dtype: String,
    /// Optimizer (sgd has momentum 0.9).
    #[arg(long, default_value = "sgd", value_parser = ["sgd", "adam", "adamw"])]
    pub optimizer: String,
    /// Fuse the optimizer into backward (`backward_step`).
    #[arg(long)]
    pub fused: bool,
    /// Activation checkpointing per block (each residual block or encoder
    /// layer keeps only its input; backward runs it again).
    #[arg(long)]
    pub checkpoint: bool,
    /// Data parallel over this many GPUs (each running --batch): one rank's
    /// memory next to one device's (predicted on the meta device).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub world_size: u32,
    /// With --world-size: the optimizer state sharded over the ranks
    /// (ZeRO stage 1; stage 2 with --fused).
    #[arg(long)]
    pub shard_optimizer: bool,
    /// How Adam keeps its two moments: `f32` (the parameters' dtype),
    /// `bf16` (half the bytes), or `8bit` (block-wise quantised as
    /// bitsandbytes' 8-bit optimizers do: a quarter, for parameters of
    /// 4096 elements or more).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "8bit"])]
    pub optimizer_state: String,
    /// Mixed precision (as `torch.autocast`): matrix products, linear
    /// layers and convolutions in bf16 or f16; norms, softmax and the loss
    /// in f32; f32 weights, gradients and optimizer.
    #[arg(long, value_parser = ["bf16", "f16"])]
    pub autocast: Option<String>,
    /// `meta` predicts without data; `cpu` runs the step for real;
    /// `cuda` runs it on CUDA device 0 (an error without one).
    #[arg(long, default_value = "meta", value_parser = ["meta", "cpu", "cuda"])]
    pub device: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// How many layers to list (most saved by PyTorch's policy over lean first).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Also write every ledger event of both steps to this JSON file.
    #[arg(long)]
    pub timeline: Option<PathBuf>,
    /// Also draw both steps' memory over time to this PNG or SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Add a column of what PyTorch itself keeps for the same step, run
    /// by python-compare/torch_step_memory.py with `LEANGRAD_PYTHON` (else
    /// `python3`), which needs torch and torchvision (CNNs) or
    /// transformers (vit_b16, bert_base, roberta_base, xlm_roberta_base,
    /// gpt2, mistral_7b). Alone: on the step's
    /// `--device` (on meta PyTorch can measure only the parameters and the
    /// saved bytes); `cpu`: PyTorch runs the step on the CPU at
    /// `--torch-batch`, which measures its peak too; `meta`: on meta.
    #[arg(
        long,
        num_args = 0..=1,
        default_missing_value = SAME_DEVICE,
        value_parser = clap::builder::PossibleValuesParser::new([
            clap::builder::PossibleValue::new("meta"),
            clap::builder::PossibleValue::new("cpu"),
            clap::builder::PossibleValue::new(SAME_DEVICE).hide(true),
        ]),
    )]
    pub compare_torch: Option<String>,
    /// The batch PyTorch's run of --compare-torch uses (default: 2 for
    /// `--compare-torch cpu`, at most --batch; else --batch). At another
    /// batch than --batch, its numbers are shown next to leangrad's for
    /// that batch.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub torch_batch: Option<u32>,
}

/// `--workers`: a whole number from 0 to [`leangrad::data::MAX_WORKERS`]
/// (each worker is a thread; more decode nothing faster).
fn parse_workers(text: &str) -> Result<usize, String> {
    let most = leangrad::data::MAX_WORKERS;
    match text.parse::<usize>() {
        Ok(n) if n <= most => Ok(n),
        _ => Err(format!("expected a number of threads from 0 to {most}")),
    }
}

/// `--compare-torch` given without a value: PyTorch runs on the step's
/// own device.
pub const SAME_DEVICE: &str = "same";
