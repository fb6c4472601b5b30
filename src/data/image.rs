//! Image files ⇄ tensors: PNG, JPEG and BMP decoded by the `image` crate
//! into `[C, H, W]` f32 tensors in [0, 1] (torchvision's `to_tensor`), and
//! tensors written as 8- or 16-bit PNG with torchvision's `save_image`
//! rounding.

use std::path::{Path, PathBuf};

use image::{DynamicImage, ImageBuffer, ImageFormat, ImageReader, Luma, Rgb, Rgba};

use super::pad::make_grid;
use crate::{DType, Device, Error, Result, Tensor};

/// Which channels an image is read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorMode {
    /// Three channels, as torchvision's default loader (`convert("RGB")`):
    /// grayscale is repeated into R, G and B; alpha is dropped (not
    /// composited).
    #[default]
    Rgb,
    /// Four channels; images without alpha get an opaque one.
    Rgba,
    /// The channels the file has: 1 (gray), 2 (gray + alpha), 3 or 4.
    Unchanged,
}

/// The sample depth of a written PNG.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PngDepth {
    /// 8 bits per sample: `v = trunc(clamp(x·255 + 0.5, 0, 255))`.
    #[default]
    Eight,
    /// 16 bits per sample: `v = trunc(clamp(x·65535 + 0.5, 0, 65535))`.
    Sixteen,
}

fn image_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Image {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Reads an image file as an RGB `[3, H, W]` f32 tensor in [0, 1] on the CPU.
/// The format is recognised from the contents (a PNG named `.jpg` still
/// reads); a file that is not a PNG, JPEG or BMP image, or is damaged, is
/// [`Error::Image`] naming the file.
pub fn read_image(path: impl AsRef<Path>) -> Result<Tensor> {
    read_image_as(path, ColorMode::Rgb)
}

/// Reads an image file with the channels of `mode` (see [`read_image`]).
/// 8-bit samples become `v / 255`, 16-bit ones `v / 65535`.
pub fn read_image_as(path: impl AsRef<Path>, mode: ColorMode) -> Result<Tensor> {
    let path = path.as_ref();
    let reader = ImageReader::open(path)
        .and_then(ImageReader::with_guessed_format)
        .map_err(|e| image_error(path, e))?;
    if reader.format().is_none() {
        return Err(image_error(
            path,
            "not a PNG, JPEG or BMP image (contents not recognised)",
        ));
    }
    let decoded = reader.decode().map_err(|e| image_error(path, e))?;
    decoded_to_tensor(&decoded, mode)
}

/// Decodes an image held in memory (see [`read_image_as`]); errors name
/// `<bytes>` as the file.
pub fn decode_image(bytes: &[u8], mode: ColorMode) -> Result<Tensor> {
    let path = PathBuf::from("<bytes>");
    let decoded = image::load_from_memory(bytes).map_err(|e| image_error(&path, e))?;
    decoded_to_tensor(&decoded, mode)
}

/// torchvision's `to_tensor` for 8-bit pixels: `hwc` holds `height × width
/// × channels` samples, row by row, channels interleaved; the result is a
/// `[channels, height, width]` f32 tensor of `v / 255` on the CPU.
pub fn to_tensor(hwc: &[u8], height: usize, width: usize, channels: usize) -> Result<Tensor> {
    if hwc.len() != height * width * channels {
        return Err(Error::InvalidArgument {
            op: "to_tensor",
            msg: format!(
                "{} samples for a {height}×{width} image of {channels} channels",
                hwc.len()
            ),
        });
    }
    planar(hwc, height, width, channels, |v| v as f32 / 255.0)
}

/// Interleaved samples (HWC) to a planar `[C, H, W]` f32 tensor.
fn planar<T: Copy>(
    hwc: &[T],
    height: usize,
    width: usize,
    channels: usize,
    to_unit: impl Fn(T) -> f32,
) -> Result<Tensor> {
    let plane = height * width;
    let mut chw = vec![0f32; channels * plane];
    for (p, pixel) in hwc.chunks_exact(channels).enumerate() {
        for (c, &v) in pixel.iter().enumerate() {
            chw[c * plane + p] = to_unit(v);
        }
    }
    Tensor::from_vec(chw, &[channels, height, width], Device::Cpu)
}

fn decoded_to_tensor(img: &DynamicImage, mode: ColorMode) -> Result<Tensor> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let sixteen = matches!(
        img,
        DynamicImage::ImageLuma16(_)
            | DynamicImage::ImageLumaA16(_)
            | DynamicImage::ImageRgb16(_)
            | DynamicImage::ImageRgba16(_)
    );
    let channels = match mode {
        ColorMode::Rgb => 3,
        ColorMode::Rgba => 4,
        ColorMode::Unchanged => img.color().channel_count() as usize,
    };
    if sixteen {
        let to_unit = |v: u16| v as f32 / 65535.0;
        match channels {
            1 => planar(img.to_luma16().as_raw(), h, w, 1, to_unit),
            2 => planar(img.to_luma_alpha16().as_raw(), h, w, 2, to_unit),
            3 => planar(img.to_rgb16().as_raw(), h, w, 3, to_unit),
            _ => planar(img.to_rgba16().as_raw(), h, w, 4, to_unit),
        }
    } else {
        // Float images (not produced by PNG/JPEG/BMP) land here too, as 8 bits.
        let to_unit = |v: u8| v as f32 / 255.0;
        match channels {
            1 => planar(img.to_luma8().as_raw(), h, w, 1, to_unit),
            2 => planar(img.to_luma_alpha8().as_raw(), h, w, 2, to_unit),
            3 => planar(img.to_rgb8().as_raw(), h, w, 3, to_unit),
            _ => planar(img.to_rgba8().as_raw(), h, w, 4, to_unit),
        }
    }
}

/// The `[C, H, W]` shape of an image tensor to write: rank 3, or rank 4
/// with a batch of one.
fn image_shape(t: &Tensor, path: &Path) -> Result<(usize, usize, usize)> {
    let shape = t.shape();
    let chw = match shape {
        [c, h, w] | [1, c, h, w] => (*c, *h, *w),
        _ => {
            return Err(image_error(
                path,
                format!(
                    "cannot write a tensor of shape {shape:?}: expected [C, H, W] or a batch [N, C, H, W]"
                ),
            ))
        }
    };
    if !matches!(chw.0, 1 | 3 | 4) {
        return Err(image_error(
            path,
            format!("cannot write {} channels as PNG: expected 1, 3 or 4", chw.0),
        ));
    }
    if chw.1 == 0 || chw.2 == 0 || chw.1 > u32::MAX as usize || chw.2 > u32::MAX as usize {
        return Err(image_error(
            path,
            format!("cannot write a {}×{} image", chw.1, chw.2),
        ));
    }
    Ok(chw)
}

/// Writes a `[C, H, W]` (or `[1, C, H, W]`) float tensor with values in
/// [0, 1] as a PNG file: C = 1 gray, 3 RGB, 4 RGBA. A batch `[N, C, H, W]`
/// is written as one grid, as `save_image` does (see [`make_grid`]: eight
/// to a row, 2 black pixels between). Values are scaled,
/// rounded and clamped as torchvision's `save_image` does (`x·255 + 0.5`,
/// clamped to [0, 255], truncated; NaN becomes 0), in f32; with
/// [`PngDepth::Sixteen`], with 65535 instead of 255. A tensor on a GPU is
/// copied to the host first.
pub fn write_png(tensor: &Tensor, path: impl AsRef<Path>, depth: PngDepth) -> Result<()> {
    let path = path.as_ref();
    // A batch is written as save_image writes it: make_grid's defaults.
    let grid;
    let tensor = match tensor.shape() {
        [n, ..] if tensor.rank() == 4 && *n > 1 => {
            grid = make_grid(tensor, 8, 2, 0.0)?;
            &grid
        }
        _ => tensor,
    };
    let (c, h, w) = image_shape(tensor, path)?;
    if !tensor.dtype().is_float() {
        return Err(Error::UnsupportedDType {
            op: "write_png",
            dtype: tensor.dtype(),
        });
    }
    let values = tensor.to_dtype(DType::F32)?.to_vec::<f32>()?;
    let plane = h * w;
    // Planar to interleaved, quantised as save_image does.
    let interleave = |max: f32| -> Vec<f32> {
        let mut out = vec![0f32; c * plane];
        for (ch, chunk) in values.chunks_exact(plane).enumerate() {
            for (p, &x) in chunk.iter().enumerate() {
                out[p * c + ch] = (x * max + 0.5).clamp(0.0, max);
            }
        }
        out
    };
    let (wu, hu) = (w as u32, h as u32);
    let shape_error = || image_error(path, "pixel buffer does not match the image size");
    let image = match depth {
        PngDepth::Eight => {
            let raw: Vec<u8> = interleave(255.0).into_iter().map(|v| v as u8).collect();
            match c {
                1 => ImageBuffer::<Luma<u8>, _>::from_raw(wu, hu, raw).map(DynamicImage::from),
                3 => ImageBuffer::<Rgb<u8>, _>::from_raw(wu, hu, raw).map(DynamicImage::from),
                _ => ImageBuffer::<Rgba<u8>, _>::from_raw(wu, hu, raw).map(DynamicImage::from),
            }
        }
        PngDepth::Sixteen => {
            let raw: Vec<u16> = interleave(65535.0).into_iter().map(|v| v as u16).collect();
            match c {
                1 => ImageBuffer::<Luma<u16>, _>::from_raw(wu, hu, raw).map(DynamicImage::from),
                3 => ImageBuffer::<Rgb<u16>, _>::from_raw(wu, hu, raw).map(DynamicImage::from),
                _ => ImageBuffer::<Rgba<u16>, _>::from_raw(wu, hu, raw).map(DynamicImage::from),
            }
        }
    }
    .ok_or_else(shape_error)?;
    image
        .save_with_format(path, ImageFormat::Png)
        .map_err(|e| image_error(path, e))
}
