//! torchvision's image transforms on `[C, H, W]` (or `[N, C, H, W]`) f32
//! tensors, each a [`Transform`]; [`Compose`] chains them. The random ones
//! draw from the [`SampleRng`] they are handed, so a loader's seed decides
//! every crop and flip.

use super::pad::{pad, pad_plan, PaddingMode};
use super::plan::{f32_bytes, StepPlan};
use super::random::SampleRng;
use super::resize::{resize, resize_plan};
use crate::memory::host::{checked_count, try_collect, try_zeroed};
use crate::{DType, Error, Result, Tensor};

/// ImageNet's per-channel mean (R, G, B), as torchvision's pretrained models
/// expect.
pub const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviation (R, G, B).
pub const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// One step of an image pipeline: takes an image tensor, returns the
/// transformed one, drawing any randomness from `rng`.
pub trait Transform: Send + Sync {
    /// Applies the step to `image`.
    fn apply(&self, image: &Tensor, rng: &mut SampleRng) -> Result<Tensor>;

    /// The output shape and the most host bytes `apply` holds for an f32
    /// image of shape `input`, computed from the shape alone, so that a
    /// pipeline too large for the host is refused before a file is decoded
    /// ([`super::read_image_with`]). `None` (the default, for transforms
    /// that cannot say): only the decoding is checked beforehand, and the
    /// step's own allocations fail as [`Error::OutOfMemory`].
    fn plan(&self, input: &[usize]) -> Result<Option<StepPlan>> {
        let _ = input;
        Ok(None)
    }

    /// Applies the step outside a loader, any random choice drawn from
    /// seed 0.
    fn apply_once(&self, image: &Tensor) -> Result<Tensor> {
        self.apply(image, &mut SampleRng::new(0))
    }
}

/// A chain of transforms applied in order (torchvision's `Compose`).
#[derive(Default)]
pub struct Compose {
    steps: Vec<Box<dyn Transform>>,
}

impl Compose {
    /// An empty chain (the identity).
    pub fn new() -> Compose {
        Compose::default()
    }

    /// The chain with `step` appended.
    pub fn then(mut self, step: impl Transform + 'static) -> Compose {
        self.steps.push(Box::new(step));
        self
    }

    /// The number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether the chain has no steps.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

impl Transform for Compose {
    fn apply(&self, image: &Tensor, rng: &mut SampleRng) -> Result<Tensor> {
        let mut x = image.clone();
        for step in &self.steps {
            x = step.apply(&x, rng)?;
        }
        Ok(x)
    }

    /// Each step's plan in turn (`None` when any step cannot say); the
    /// bytes are the largest of the steps'.
    fn plan(&self, input: &[usize]) -> Result<Option<StepPlan>> {
        let mut shape = input.to_vec();
        let mut bytes = f32_bytes(input);
        for step in &self.steps {
            let Some(p) = step.plan(&shape)? else {
                return Ok(None);
            };
            bytes = bytes.max(p.bytes);
            shape = p.shape;
        }
        Ok(Some(StepPlan { shape, bytes }))
    }
}

/// `shape` with its last two axes set to `h × w`.
fn with_hw(shape: &[usize], h: usize, w: usize) -> Vec<usize> {
    let mut out = shape.to_vec();
    let rank = out.len();
    out[rank - 2] = h;
    out[rank - 1] = w;
    out
}

/// The (height, width) of the last two axes of an image shape.
fn shape_hw(op: &'static str, shape: &[usize]) -> Result<(usize, usize)> {
    match shape {
        [.., h, w] if (3..=4).contains(&shape.len()) => Ok((*h, *w)),
        _ => Err(Error::InvalidArgument {
            op,
            msg: format!("expected a [C, H, W] or [N, C, H, W] image, got shape {shape:?}"),
        }),
    }
}

/// The (height, width) of an image tensor's last two axes.
fn image_hw(op: &'static str, image: &Tensor) -> Result<(usize, usize)> {
    match image.shape() {
        [.., h, w] if (3..=4).contains(&image.rank()) => Ok((*h, *w)),
        shape => Err(Error::InvalidArgument {
            op,
            msg: format!("expected a [C, H, W] or [N, C, H, W] image, got shape {shape:?}"),
        }),
    }
}

/// The size `Resize` produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeTo {
    /// The shorter side becomes this, the longer keeps the aspect ratio
    /// (`int(s · long / short)`, truncated, as torchvision computes it).
    Shorter(usize),
    /// Exactly (height, width).
    Exact(usize, usize),
}

impl ResizeTo {
    /// The output (height, width) for an input of `h × w`.
    pub fn output_size(self, h: usize, w: usize) -> (usize, usize) {
        match self {
            ResizeTo::Exact(oh, ow) => (oh, ow),
            ResizeTo::Shorter(s) => {
                let (short, long) = if w <= h { (w, h) } else { (h, w) };
                let new_long = (s as f64 * long as f64 / short as f64) as usize;
                if w <= h {
                    (new_long, s)
                } else {
                    (s, new_long)
                }
            }
        }
    }
}

/// Antialiased bilinear resize (torchvision's `Resize(size,
/// antialias=True)` on tensors).
#[derive(Debug, Clone, Copy)]
pub struct Resize(pub ResizeTo);

impl Resize {
    /// The shorter side to `size`, keeping the aspect ratio.
    pub fn shorter(size: usize) -> Resize {
        Resize(ResizeTo::Shorter(size))
    }

    /// Exactly `height × width`.
    pub fn exact(height: usize, width: usize) -> Resize {
        Resize(ResizeTo::Exact(height, width))
    }
}

impl Transform for Resize {
    fn apply(&self, image: &Tensor, _: &mut SampleRng) -> Result<Tensor> {
        let (h, w) = image_hw("Resize", image)?;
        let (oh, ow) = self.0.output_size(h, w);
        resize(image, oh, ow)
    }

    fn plan(&self, input: &[usize]) -> Result<Option<StepPlan>> {
        let (h, w) = shape_hw("Resize", input)?;
        let (oh, ow) = self.0.output_size(h, w);
        Ok(Some(StepPlan {
            shape: with_hw(input, oh, ow),
            bytes: resize_plan(input, oh, ow),
        }))
    }
}

/// The `height × width` window at (`top`, `left`) of an image, as a view
/// (no copy); differentiable.
pub fn crop(
    image: &Tensor,
    top: usize,
    left: usize,
    height: usize,
    width: usize,
) -> Result<Tensor> {
    let (h, w) = image_hw("crop", image)?;
    let inside =
        |start: usize, len: usize, size: usize| start.checked_add(len).is_some_and(|e| e <= size);
    if !inside(top, height, h) || !inside(left, width, w) {
        return Err(Error::InvalidArgument {
            op: "crop",
            msg: format!("a {height}×{width} window at ({top}, {left}) is outside a {h}×{w} image"),
        });
    }
    image.narrow(-2, top, height)?.narrow(-1, left, width)
}

/// The centred `height × width` window (torchvision's `center_crop`: the
/// offsets are `round((H − h) / 2)`, ties to even). A window larger than the
/// image pads it with zeros first, as torchvision does.
pub fn center_crop(image: &Tensor, height: usize, width: usize) -> Result<Tensor> {
    let (h, w) = image_hw("center_crop", image)?;
    if height > h || width > w {
        let (pad_top, pad_left) = (height.saturating_sub(h) / 2, width.saturating_sub(w) / 2);
        let padded = pad_zeros(image, pad_top, pad_left, height.max(h), width.max(w))?;
        return center_crop(&padded, height, width);
    }
    let top = ((h - height) as f64 / 2.0).round_ties_even() as usize;
    let left = ((w - width) as f64 / 2.0).round_ties_even() as usize;
    crop(image, top, left, height, width)
}

/// `image` placed at (`top`, `left`) in zeros of `height × width`.
fn pad_zeros(
    image: &Tensor,
    top: usize,
    left: usize,
    height: usize,
    width: usize,
) -> Result<Tensor> {
    let (h, w) = image_hw("center_crop", image)?;
    let planes = checked_count(&image.shape()[..image.rank() - 2])?;
    let src = image.to_dtype(DType::F32)?.to_vec::<f32>()?;
    let mut out = try_zeroed::<f32>(checked_count(&[planes, height, width])?)?;
    for p in 0..planes {
        for y in 0..h {
            let from = &src[(p * h + y) * w..][..w];
            out[(p * height + top + y) * width + left..][..w].copy_from_slice(from);
        }
    }
    let mut shape = image.shape().to_vec();
    let rank = shape.len();
    shape[rank - 2] = height;
    shape[rank - 1] = width;
    Tensor::from_vec(out, &shape, image.device())?.to_dtype(image.dtype())
}

/// The centred window (torchvision's `CenterCrop`).
#[derive(Debug, Clone, Copy)]
pub struct CenterCrop {
    /// Window height.
    pub height: usize,
    /// Window width.
    pub width: usize,
}

impl CenterCrop {
    /// A `size × size` window.
    pub fn square(size: usize) -> CenterCrop {
        CenterCrop {
            height: size,
            width: size,
        }
    }
}

impl Transform for CenterCrop {
    fn apply(&self, image: &Tensor, _: &mut SampleRng) -> Result<Tensor> {
        center_crop(image, self.height, self.width)
    }

    fn plan(&self, input: &[usize]) -> Result<Option<StepPlan>> {
        let (h, w) = shape_hw("CenterCrop", input)?;
        let shape = with_hw(input, self.height, self.width);
        // A window larger than the image pads it: a copy and the padded one.
        let padded = with_hw(input, self.height.max(h), self.width.max(w));
        let bytes = if self.height > h || self.width > w {
            f32_bytes(input)
                .saturating_mul(2)
                .saturating_add(f32_bytes(&padded))
        } else {
            f32_bytes(input)
        };
        Ok(Some(StepPlan { shape, bytes }))
    }
}

/// A window at a uniformly random position (torchvision's `RandomCrop`):
/// the image is first padded by `padding` (`[left, top, right, bottom]`)
/// and, with `pad_if_needed`, a side shorter than the window is padded by
/// the missing length on *both* sides, as torchvision does; borders are
/// filled by `padding_mode`.
#[derive(Debug, Clone, Copy)]
pub struct RandomCrop {
    /// Window height.
    pub height: usize,
    /// Window width.
    pub width: usize,
    /// Border added before cropping, `[left, top, right, bottom]`.
    pub padding: Option<[usize; 4]>,
    /// Pads a side shorter than the window instead of failing.
    pub pad_if_needed: bool,
    /// How borders are filled.
    pub padding_mode: PaddingMode,
}

impl RandomCrop {
    /// A `height × width` window, without padding.
    pub fn new(height: usize, width: usize) -> RandomCrop {
        RandomCrop {
            height,
            width,
            padding: None,
            pad_if_needed: false,
            padding_mode: PaddingMode::default(),
        }
    }

    /// The same with `padding` pixels on every side (torchvision's
    /// `RandomCrop(size, padding=p)`, CIFAR's usual 32 with 4).
    pub fn padding(mut self, padding: usize) -> RandomCrop {
        self.padding = Some([padding; 4]);
        self
    }
}

impl Transform for RandomCrop {
    fn apply(&self, image: &Tensor, rng: &mut SampleRng) -> Result<Tensor> {
        image_hw("RandomCrop", image)?;
        let mut image = match self.padding {
            Some(borders) => pad(image, borders, self.padding_mode)?,
            None => image.clone(),
        };
        let (_, w) = image_hw("RandomCrop", &image)?;
        if self.pad_if_needed && w < self.width {
            let d = self.width - w;
            image = pad(&image, [d, 0, d, 0], self.padding_mode)?;
        }
        let (h, _) = image_hw("RandomCrop", &image)?;
        if self.pad_if_needed && h < self.height {
            let d = self.height - h;
            image = pad(&image, [0, d, 0, d], self.padding_mode)?;
        }
        let (h, w) = image_hw("RandomCrop", &image)?;
        if self.height > h || self.width > w {
            return Err(Error::InvalidArgument {
                op: "RandomCrop",
                msg: format!(
                    "window {}×{} is larger than the {h}×{w} image (set pad_if_needed to pad it)",
                    self.height, self.width
                ),
            });
        }
        let top = rng.below(h - self.height + 1);
        let left = rng.below(w - self.width + 1);
        crop(&image, top, left, self.height, self.width)
    }

    /// The paddings in turn (the window itself is a view).
    fn plan(&self, input: &[usize]) -> Result<Option<StepPlan>> {
        let (mut shape, mut bytes) = (input.to_vec(), f32_bytes(input));
        let mut add = |borders: [usize; 4], shape: &mut Vec<usize>| {
            let p = pad_plan(shape, borders);
            bytes = bytes.max(p.bytes);
            *shape = p.shape;
        };
        if let Some(borders) = self.padding {
            add(borders, &mut shape);
        }
        let (_, w) = shape_hw("RandomCrop", &shape)?;
        if self.pad_if_needed && w < self.width {
            let d = self.width - w;
            add([d, 0, d, 0], &mut shape);
        }
        let (h, _) = shape_hw("RandomCrop", &shape)?;
        if self.pad_if_needed && h < self.height {
            let d = self.height - h;
            add([0, d, 0, d], &mut shape);
        }
        Ok(Some(StepPlan {
            shape: with_hw(&shape, self.height, self.width),
            bytes,
        }))
    }
}

/// A random window of random area and aspect ratio, resized to `height ×
/// width` (torchvision's `RandomResizedCrop` with antialiased bilinear
/// resizing): up to ten draws of an area fraction in `scale` and a log-
/// uniform aspect ratio in `ratio`; if none fits, the centred crop of the
/// largest window whose ratio is within `ratio`.
#[derive(Debug, Clone, Copy)]
pub struct RandomResizedCrop {
    /// Output height.
    pub height: usize,
    /// Output width.
    pub width: usize,
    /// Range of the window's area as a fraction of the image's.
    pub scale: (f64, f64),
    /// Range of the window's width / height.
    pub ratio: (f64, f64),
}

impl RandomResizedCrop {
    /// torchvision's defaults: `scale = (0.08, 1)`, `ratio = (3/4, 4/3)`,
    /// output `size × size`.
    pub fn new(size: usize) -> RandomResizedCrop {
        RandomResizedCrop {
            height: size,
            width: size,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
        }
    }

    /// The window (top, left, height, width) for an `h × w` image.
    pub fn window(&self, h: usize, w: usize, rng: &mut SampleRng) -> (usize, usize, usize, usize) {
        let area = (h * w) as f64;
        let (log_lo, log_hi) = (self.ratio.0.ln(), self.ratio.1.ln());
        for _ in 0..10 {
            let target = area * rng.uniform_in(self.scale.0, self.scale.1);
            let aspect = rng.uniform_in(log_lo, log_hi).exp();
            let cw = (target * aspect).sqrt().round_ties_even() as usize;
            let ch = (target / aspect).sqrt().round_ties_even() as usize;
            if 0 < cw && cw <= w && 0 < ch && ch <= h {
                let top = rng.below(h - ch + 1);
                let left = rng.below(w - cw + 1);
                return (top, left, ch, cw);
            }
        }
        let in_ratio = w as f64 / h as f64;
        let (lo, hi) = (
            self.ratio.0.min(self.ratio.1),
            self.ratio.0.max(self.ratio.1),
        );
        let (ch, cw) = if in_ratio < lo {
            ((w as f64 / lo).round_ties_even() as usize, w)
        } else if in_ratio > hi {
            (h, (h as f64 * hi).round_ties_even() as usize)
        } else {
            (h, w)
        };
        ((h - ch) / 2, (w - cw) / 2, ch, cw)
    }
}

impl Transform for RandomResizedCrop {
    fn apply(&self, image: &Tensor, rng: &mut SampleRng) -> Result<Tensor> {
        let (h, w) = image_hw("RandomResizedCrop", image)?;
        let (top, left, ch, cw) = self.window(h, w, rng);
        let window = crop(image, top, left, ch, cw)?;
        resize(&window, self.height, self.width)
    }

    /// At most the resize of the whole image (the window is within it).
    fn plan(&self, input: &[usize]) -> Result<Option<StepPlan>> {
        shape_hw("RandomResizedCrop", input)?;
        Ok(Some(StepPlan {
            shape: with_hw(input, self.height, self.width),
            bytes: resize_plan(input, self.height, self.width),
        }))
    }
}

/// The image mirrored left to right (a copy; differentiable; any device).
pub fn hflip(image: &Tensor) -> Result<Tensor> {
    let (_, w) = image_hw("hflip", image)?;
    let reversed: Vec<i64> = try_collect(w, (0..w as i64).rev())?;
    let index = Tensor::from_vec(reversed, &[w], crate::Device::Cpu)?.to_device(image.device())?;
    image.index_select(-1, &index)
}

/// Mirrors the image left to right with probability `p` (torchvision's
/// `RandomHorizontalFlip`: flipped when a uniform draw is below `p`).
#[derive(Debug, Clone, Copy)]
pub struct RandomHorizontalFlip {
    /// The probability of a flip.
    pub p: f64,
}

impl Default for RandomHorizontalFlip {
    /// `p = 0.5`.
    fn default() -> Self {
        RandomHorizontalFlip { p: 0.5 }
    }
}

impl Transform for RandomHorizontalFlip {
    fn apply(&self, image: &Tensor, rng: &mut SampleRng) -> Result<Tensor> {
        if rng.uniform() < self.p {
            hflip(image)
        } else {
            Ok(image.clone())
        }
    }

    /// The input, the flipped copy and its index.
    fn plan(&self, input: &[usize]) -> Result<Option<StepPlan>> {
        let (_, w) = shape_hw("RandomHorizontalFlip", input)?;
        Ok(Some(StepPlan {
            shape: input.to_vec(),
            bytes: f32_bytes(input)
                .saturating_mul(2)
                .saturating_add(w.saturating_mul(8)),
        }))
    }
}

/// The plan of an elementwise step of two ops (normalisation): the input,
/// the first op's output and the second's.
fn two_op_plan(input: &[usize]) -> Option<StepPlan> {
    Some(StepPlan {
        shape: input.to_vec(),
        bytes: f32_bytes(input).saturating_mul(3),
    })
}

/// `[C, 1, 1]` channel statistics in the image's dtype, on its device.
fn channel_stats(op: &'static str, image: &Tensor, values: &[f64]) -> Result<Tensor> {
    let c = image.shape().get(image.rank().wrapping_sub(3)).copied();
    if image.rank() < 3 || c != Some(values.len()) {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "{} channel statistics for an image of shape {:?} (channels on axis -3)",
                values.len(),
                image.shape()
            ),
        });
    }
    Tensor::from_f64_slice(
        values,
        &[values.len(), 1, 1],
        image.dtype(),
        crate::Device::Cpu,
    )?
    .to_device(image.device())
}

/// `(x − mean) / std` per channel (torchvision's `normalize`), with the
/// statistics rounded to the image's dtype first; differentiable, any
/// device, `[C, H, W]` or `[N, C, H, W]`.
pub fn normalize(image: &Tensor, mean: &[f64], std: &[f64]) -> Result<Tensor> {
    let m = channel_stats("normalize", image, mean)?;
    let s = channel_stats("normalize", image, std)?;
    image.sub(&m)?.div(&s)
}

/// The inverse of [`normalize`]: `x · std + mean` per channel, to turn a
/// model's input back into an image in [0, 1] for saving.
pub fn denormalize(image: &Tensor, mean: &[f64], std: &[f64]) -> Result<Tensor> {
    let m = channel_stats("denormalize", image, mean)?;
    let s = channel_stats("denormalize", image, std)?;
    image.mul(&s)?.add(&m)
}

/// Per-channel standardisation (torchvision's `Normalize`).
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    /// The per-channel means.
    pub mean: Vec<f64>,
    /// The per-channel standard deviations.
    pub std: Vec<f64>,
}

impl Normalize {
    /// With ImageNet's statistics ([`IMAGENET_MEAN`], [`IMAGENET_STD`]).
    pub fn imagenet() -> Normalize {
        Normalize {
            mean: IMAGENET_MEAN.to_vec(),
            std: IMAGENET_STD.to_vec(),
        }
    }

    /// The transform that undoes this one.
    pub fn inverse(&self) -> Denormalize {
        Denormalize {
            mean: self.mean.clone(),
            std: self.std.clone(),
        }
    }
}

impl Transform for Normalize {
    fn apply(&self, image: &Tensor, _: &mut SampleRng) -> Result<Tensor> {
        normalize(image, &self.mean, &self.std)
    }

    fn plan(&self, input: &[usize]) -> Result<Option<StepPlan>> {
        Ok(two_op_plan(input))
    }
}

/// The inverse of [`Normalize`] (see [`denormalize`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Denormalize {
    /// The per-channel means that were subtracted.
    pub mean: Vec<f64>,
    /// The per-channel standard deviations that were divided by.
    pub std: Vec<f64>,
}

impl Transform for Denormalize {
    fn apply(&self, image: &Tensor, _: &mut SampleRng) -> Result<Tensor> {
        denormalize(image, &self.mean, &self.std)
    }

    fn plan(&self, input: &[usize]) -> Result<Option<StepPlan>> {
        Ok(two_op_plan(input))
    }
}
