//! Image files ⇄ tensors: PNG, JPEG and BMP decoded by the `image` crate
//! into `[C, H, W]` f32 tensors in [0, 1] (torchvision's `to_tensor`), and
//! tensors written as 8- or 16-bit PNG with torchvision's `save_image`
//! rounding, marked as leangrad's own (a `Software: leangrad` text chunk)
//! so that a job replaces only files it wrote.

use std::path::{Path, PathBuf};

use image::{DynamicImage, ImageReader};

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
/// copied to the host first. The file carries the [`PNG_MARKER`] text
/// chunk (`Software` = `leangrad`), by which the jobs recognise their own
/// earlier outputs ([`is_leangrad_png`]).
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
    let (bytes, bit_depth) = match depth {
        PngDepth::Eight => (
            interleave(255.0).into_iter().map(|v| v as u8).collect(),
            png::BitDepth::Eight,
        ),
        // PNG stores 16-bit samples big-endian.
        PngDepth::Sixteen => (
            interleave(65535.0)
                .into_iter()
                .flat_map(|v| (v as u16).to_be_bytes())
                .collect::<Vec<u8>>(),
            png::BitDepth::Sixteen,
        ),
    };
    let color = match c {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    };
    encode_png(path, (w as u32, h as u32), color, bit_depth, &bytes)
}

/// The keyword and text of the PNG `tEXt` chunk every PNG leangrad writes
/// carries: what lets a job tell its own earlier output (which it may
/// replace) from a user's file (which it never overwrites).
pub const PNG_MARKER: (&str, &str) = ("Software", "leangrad");

/// Writes `samples` (interleaved, `color` and `bit_depth` as PNG stores
/// them) as a PNG file with the [`PNG_MARKER`] text chunk.
fn encode_png(
    path: &Path,
    (width, height): (u32, u32),
    color: png::ColorType,
    bit_depth: png::BitDepth,
    samples: &[u8],
) -> Result<()> {
    let file = std::fs::File::create(path).map_err(|e| image_error(path, e))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    encoder.set_color(color);
    encoder.set_depth(bit_depth);
    let (keyword, text) = PNG_MARKER;
    encoder
        .add_text_chunk(keyword.into(), text.into())
        .map_err(|e| image_error(path, e))?;
    let mut writer = encoder.write_header().map_err(|e| image_error(path, e))?;
    writer
        .write_image_data(samples)
        .map_err(|e| image_error(path, e))?;
    writer.finish().map_err(|e| image_error(path, e))
}

/// Whether `path` is a PNG file that leangrad wrote: it carries the
/// [`PNG_MARKER`] text chunk (`Software` = `leangrad`) before its image
/// data. Anything else (no such file, a folder, another format, a PNG
/// from another program, a damaged file) is `false`. Only the chunks
/// before the image data are read.
pub fn is_leangrad_png(path: impl AsRef<Path>) -> bool {
    let Ok(file) = std::fs::File::open(path.as_ref()) else {
        return false;
    };
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_ignore_text_chunk(false);
    let Ok(reader) = decoder.read_info() else {
        return false;
    };
    let (keyword, text) = PNG_MARKER;
    reader
        .info()
        .uncompressed_latin1_text
        .iter()
        .any(|t| t.keyword == keyword && t.text == text)
}

/// Checks, before a job does any work, that it may write each of
/// `outputs` (PNG files it will write): a path that exists must be a PNG
/// that leangrad wrote ([`is_leangrad_png`]), which the job replaces;
/// every folder on the way must be a folder (or not exist yet: the job
/// makes it); no two outputs may be the same file. Anything else is
/// [`Error::OutputFile`] naming the file and saying to choose another
/// `option` (`--out`).
pub fn check_png_outputs(outputs: impl IntoIterator<Item = PathBuf>, option: &str) -> Result<()> {
    let refuse = |path: &Path, why: String| {
        Err(Error::OutputFile {
            path: path.to_path_buf(),
            reason: format!("{why}; choose another {option}"),
        })
    };
    let mut seen = std::collections::HashSet::new();
    for path in outputs {
        let path = path.as_path();
        if !seen.insert(path.to_path_buf()) {
            return refuse(
                path,
                "two of the run's outputs would be this one file".into(),
            );
        }
        // The nearest ancestor that exists must be a folder.
        if let Some(blocker) = path
            .ancestors()
            .skip(1)
            .find(|a| !a.as_os_str().is_empty() && std::fs::symlink_metadata(a).is_ok())
        {
            if !blocker.is_dir() {
                return refuse(path, format!("`{}` is not a folder", blocker.display()));
            }
        }
        match std::fs::symlink_metadata(path) {
            Err(_) => {}
            Ok(m) if m.is_dir() => return refuse(path, "it is a folder".into()),
            Ok(_) if is_leangrad_png(path) => {}
            Ok(_) => {
                return refuse(
                    path,
                    "a file leangrad did not write is there (a PNG leangrad writes carries the \
                     text chunk `Software: leangrad`), and leangrad never overwrites one"
                        .into(),
                )
            }
        }
    }
    Ok(())
}
