//! Images and data: image files ⇄ tensors, torchvision's transforms, an
//! `ImageFolder` dataset and a `DataLoader` that decodes on worker threads
//! ahead of the training step, and a `DistributedSampler` that gives each
//! rank of a data-parallel run its shard of every epoch.
//!
//! Images are `[C, H, W]` f32 tensors in [0, 1] (torchvision's `to_tensor`),
//! batches `[N, C, H, W]` with I64 labels (what `cross_entropy` takes).
//! Every random choice comes from an explicit seed, so runs repeat exactly.
//!
//! ```no_run
//! use leangrad::data::{
//!     CenterCrop, Compose, DataLoader, ImageFolder, Normalize, RandomHorizontalFlip, Resize,
//! };
//! use leangrad::Device;
//!
//! let train = ImageFolder::new("data/train")?.with_transform(
//!     Compose::new()
//!         .then(Resize::shorter(256))
//!         .then(CenterCrop::square(224))
//!         .then(RandomHorizontalFlip::default())
//!         .then(Normalize::imagenet()),
//! );
//! let loader = DataLoader::new(train, 32)?.shuffle(true).seed(1).workers(4);
//! for epoch in 0..2 {
//!     for batch in loader.epoch(epoch) {
//!         let batch = batch?; // images [32, 3, 224, 224], labels [32] (I64)
//!         # let _ = batch;
//!     }
//! }
//! # Ok::<(), leangrad::Error>(())
//! ```

mod dataset;
mod folder;
mod image;
mod loader;
mod pad;
mod plan;
mod random;
mod resize;
mod sampler;
mod transforms;

pub use dataset::Dataset;
pub use folder::{has_image_extension, ImageFolder, IMG_EXTENSIONS};
pub use image::{check_outputs, check_png_outputs, is_leangrad_png, write_rgb8_png, PNG_MARKER};
pub use image::{
    decode_image, read_image, read_image_as, read_image_header, read_image_with, to_tensor,
    write_png, ColorMode, ImageHeader, PngDepth, MAX_IMAGE_PIXELS,
};
pub use loader::{Batch, DataLoader, Epoch, MAX_WORKERS};
pub use pad::{make_grid, pad, PaddingMode};
pub use plan::StepPlan;
pub use random::{permutation, SampleRng};
pub use resize::resize;
pub use sampler::DistributedSampler;
pub use transforms::{
    center_crop, crop, denormalize, hflip, normalize, CenterCrop, Compose, Denormalize, Normalize,
    RandomCrop, RandomHorizontalFlip, RandomResizedCrop, Resize, ResizeTo, Transform,
    IMAGENET_MEAN, IMAGENET_STD,
};
