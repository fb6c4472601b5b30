//! Image files ⇄ tensors: PNG, JPEG and BMP decoded into `[C, H, W]` f32
//! tensors in [0, 1] (torchvision's `to_tensor`), and tensors written as
//! 8- or 16-bit PNG with torchvision's `save_image` rounding.
//!
//! Reading never trusts a file: its header (width, height, channels) is
//! read first and the bytes of the decoded pixels, of the tensor and of
//! every step of a [`Transform`] pipeline are computed from it before any
//! pixel is decoded, so a small file that claims a huge image (or a resize
//! that would make one) is refused with [`Error::Image`] naming the file
//! and the sizes, not an allocation the machine cannot give. Every buffer
//! is taken from [`crate::memory::host`], so what does not fit is
//! [`Error::OutOfMemory`], never an abort. PNG and BMP are decoded by the
//! `image` crate under [`image::Limits`]; JPEG by zune-jpeg in strict mode
//! (corrupt scan data is an error), after a walk of its markers that
//! requires the end-of-image marker after the last scan (zune-jpeg fills a
//! truncated last row with grey even in strict mode; PIL says "image file
//! is truncated").
//!
//! Every PNG leangrad writes is marked as its own (a `Software: leangrad`
//! text chunk), so that a job replaces only files it wrote.

use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use image::{ColorType, ImageDecoder, ImageFormat, ImageReader, Limits};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

use super::pad::make_grid;
use super::plan::f32_bytes;
use super::random::SampleRng;
use super::transforms::Transform;
use crate::memory::host::{checked_count, host_available_bytes, try_collect, try_vec, try_zeroed};
use crate::memory::human_bytes;
use crate::{DType, Device, Error, Result, Tensor};

/// The most pixels an image may have: PIL's limit (`2 ×
/// Image.MAX_IMAGE_PIXELS`, where it raises `DecompressionBombError`).
/// Larger headers are refused before decoding.
pub const MAX_IMAGE_PIXELS: u64 = 2 * 89_478_485;

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

/// What an image file's header says, read without decoding its pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// The channels the decoded pixels have: 1 (gray), 2 (gray + alpha),
    /// 3 (RGB) or 4 (RGBA).
    pub channels: usize,
    /// Bytes per sample: 1, or 2 for 16-bit files.
    pub sample_bytes: usize,
}

impl ImageHeader {
    /// The `[C, H, W]` shape of the tensor the image is read as with `mode`.
    pub fn tensor_shape(&self, mode: ColorMode) -> [usize; 3] {
        let c = match mode {
            ColorMode::Rgb => 3,
            ColorMode::Rgba => 4,
            ColorMode::Unchanged => self.channels,
        };
        [c, self.height, self.width]
    }

    /// The most host bytes reading the image with `mode` holds at once:
    /// the decoded pixels and the f32 tensor (saturating: a size past
    /// `usize` is `usize::MAX`, which nothing can hold).
    pub fn read_bytes(&self, mode: ColorMode) -> usize {
        let pixels = self.width.saturating_mul(self.height);
        let raw = pixels
            .saturating_mul(self.channels)
            .saturating_mul(self.sample_bytes);
        let [c, ..] = self.tensor_shape(mode);
        raw.saturating_add(pixels.saturating_mul(c).saturating_mul(4))
    }
}

fn image_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Image {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Reads an image file as an RGB `[3, H, W]` f32 tensor in [0, 1] on the CPU.
/// The format is recognised from the contents (a PNG named `.jpg` still
/// reads); a file that is not a PNG, JPEG or BMP image, is damaged or
/// truncated, or whose pixels the host cannot hold is [`Error::Image`]
/// naming the file.
pub fn read_image(path: impl AsRef<Path>) -> Result<Tensor> {
    read_image_as(path, ColorMode::Rgb)
}

/// Reads an image file with the channels of `mode` (see [`read_image`]).
/// 8-bit samples become `v / 255`, 16-bit ones `v / 65535`.
pub fn read_image_as(path: impl AsRef<Path>, mode: ColorMode) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = read_file(path)?;
    let probe = probe(&bytes, path)?;
    admit(
        path,
        &probe.header,
        mode,
        probe.header.read_bytes(mode),
        None,
    )?;
    probe.decode(mode)
}

/// Reads an image file with the channels of `mode` and applies
/// `transform` (its random choices drawn from `rng`). Before any pixel is
/// decoded, the bytes the pipeline will hold are computed from the header
/// ([`Transform::plan`]) and compared with what the host can give: a
/// pipeline that cannot fit (a 1×100000 image whose shorter side is
/// resized to 224 is 224×22400000) is [`Error::Image`] naming the file and
/// the sizes.
pub fn read_image_with(
    path: impl AsRef<Path>,
    mode: ColorMode,
    transform: &dyn Transform,
    rng: &mut SampleRng,
) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = read_file(path)?;
    let probe = probe(&bytes, path)?;
    let header = probe.header;
    let shape = header.tensor_shape(mode);
    match transform.plan(&shape)? {
        // The decoded image stays alive while the pipeline runs.
        Some(plan) => {
            let pipeline = f32_bytes(&shape).saturating_add(plan.bytes);
            let most = header.read_bytes(mode).max(pipeline);
            admit(path, &header, mode, most, Some(&plan.shape))?;
        }
        None => admit(path, &header, mode, header.read_bytes(mode), None)?,
    }
    let image = probe.decode(mode)?;
    drop(bytes);
    transform.apply(&image, rng)
}

/// The header of an image file (its size and channels), read without
/// decoding the pixels: what [`read_image_with`] checks before decoding.
/// A file that is not a PNG, JPEG or BMP image, or whose header is
/// damaged or says more than [`MAX_IMAGE_PIXELS`], is [`Error::Image`].
pub fn read_image_header(path: impl AsRef<Path>) -> Result<ImageHeader> {
    let path = path.as_ref();
    let bytes = read_file(path)?;
    let header = probe(&bytes, path)?.header;
    Ok(header)
}

/// Decodes an image held in memory (see [`read_image_as`]); errors name
/// `<bytes>` as the file.
pub fn decode_image(bytes: &[u8], mode: ColorMode) -> Result<Tensor> {
    let path = PathBuf::from("<bytes>");
    let probe = probe(bytes, &path)?;
    admit(
        &path,
        &probe.header,
        mode,
        probe.header.read_bytes(mode),
        None,
    )?;
    probe.decode(mode)
}

/// Refuses an image whose reading (and transforming) holds more than the
/// host can give, naming the file and the sizes.
fn admit(
    path: &Path,
    header: &ImageHeader,
    mode: ColorMode,
    bytes: usize,
    transformed: Option<&[usize]>,
) -> Result<()> {
    let Some(available) = host_available_bytes() else {
        return Ok(());
    };
    if bytes <= available {
        return Ok(());
    }
    let [c, h, w] = header.tensor_shape(mode);
    let what = match transformed {
        Some(shape) => {
            format!("reading this {h}×{w} image ({c} channels) and transforming it to {shape:?}")
        }
        None => format!("reading this {h}×{w} image ({c} channels)"),
    };
    let needed = if bytes == usize::MAX {
        "more than the address space".to_string()
    } else {
        human_bytes(bytes)
    };
    Err(image_error(
        path,
        format!(
            "{what} holds {needed} of host memory at once, but the host has {} available \
             (MemAvailable + SwapFree, within any cgroup limit)",
            human_bytes(available)
        ),
    ))
}

/// The whole file, in a buffer taken from the checked allocator. Only
/// regular files are read (a FIFO or a device would block or never end).
fn read_file(path: &Path) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).map_err(|e| image_error(path, e))?;
    if !meta.is_file() {
        return Err(image_error(path, "not a regular file"));
    }
    let len = usize::try_from(meta.len())
        .map_err(|_| image_error(path, "the file does not fit in the address space"))?;
    let file = std::fs::File::open(path).map_err(|e| image_error(path, e))?;
    let mut bytes = try_vec::<u8>(len)?;
    // At most the length the file had: one that grows is not read past it.
    file.take(meta.len())
        .read_to_end(&mut bytes)
        .map_err(|e| image_error(path, e))?;
    Ok(bytes)
}

/// A decoder that has read an image's header and not yet its pixels.
enum Pixels<'a> {
    /// zune-jpeg, strict (boxed: its state is large).
    Jpeg(Box<zune_jpeg::JpegDecoder<ZCursor<&'a [u8]>>>),
    /// The `image` crate's PNG or BMP decoder.
    Other(Box<dyn ImageDecoder + 'a>),
}

/// An image whose header was read and checked (size, [`MAX_IMAGE_PIXELS`]).
struct Probe<'a> {
    header: ImageHeader,
    pixels: Pixels<'a>,
    bytes: &'a [u8],
    path: &'a Path,
}

/// The header of the image in `bytes` (the whole file), and the decoder
/// that will read its pixels.
fn probe<'a>(bytes: &'a [u8], path: &'a Path) -> Result<Probe<'a>> {
    let (header, pixels) = match image::guess_format(bytes) {
        Ok(ImageFormat::Jpeg) => probe_jpeg(bytes, path)?,
        Ok(format @ (ImageFormat::Png | ImageFormat::Bmp)) => probe_png_bmp(bytes, format, path)?,
        _ => {
            return Err(image_error(
                path,
                "not a PNG, JPEG or BMP image (contents not recognised)",
            ))
        }
    };
    let (w, h) = (header.width, header.height);
    if w == 0 || h == 0 {
        return Err(image_error(path, format!("the header says {w}×{h} pixels")));
    }
    let pixels_count = (w as u64).saturating_mul(h as u64);
    if pixels_count > MAX_IMAGE_PIXELS {
        return Err(image_error(
            path,
            format!(
                "a {w}×{h} image ({pixels_count} pixels) is more than the {MAX_IMAGE_PIXELS} \
                 pixels leangrad decodes (PIL's decompression-bomb limit)"
            ),
        ));
    }
    Ok(Probe {
        header,
        pixels,
        bytes,
        path,
    })
}

/// The decoder limits: no side or allocation past what
/// [`MAX_IMAGE_PIXELS`] of 16-bit RGBA needs, nor past what the host has.
fn decoder_limits() -> Limits {
    let most = MAX_IMAGE_PIXELS * 8;
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_PIXELS as u32);
    limits.max_image_height = Some(MAX_IMAGE_PIXELS as u32);
    limits.max_alloc = Some(host_available_bytes().map_or(most, |a| (a as u64).min(most)));
    limits
}

/// A PNG's or BMP's header, read by the `image` crate under [`decoder_limits`].
fn probe_png_bmp<'a>(
    bytes: &'a [u8],
    format: ImageFormat,
    path: &Path,
) -> Result<(ImageHeader, Pixels<'a>)> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    reader.limits(decoder_limits());
    let decoder = reader.into_decoder().map_err(|e| image_error(path, e))?;
    let (w, h) = decoder.dimensions();
    let (channels, sample_bytes) = match decoder.color_type() {
        ColorType::L8 => (1, 1),
        ColorType::La8 => (2, 1),
        ColorType::Rgb8 => (3, 1),
        ColorType::Rgba8 => (4, 1),
        ColorType::L16 => (1, 2),
        ColorType::La16 => (2, 2),
        ColorType::Rgb16 => (3, 2),
        ColorType::Rgba16 => (4, 2),
        other => {
            return Err(image_error(
                path,
                format!("pixels of type {other:?} are not supported"),
            ))
        }
    };
    let header = ImageHeader {
        width: w as usize,
        height: h as usize,
        channels,
        sample_bytes,
    };
    Ok((header, Pixels::Other(Box::new(decoder))))
}

/// A JPEG's header, read by zune-jpeg in strict mode.
fn probe_jpeg<'a>(bytes: &'a [u8], path: &Path) -> Result<(ImageHeader, Pixels<'a>)> {
    let options = DecoderOptions::default()
        .set_strict_mode(true)
        .set_max_width(u16::MAX as usize)
        .set_max_height(u16::MAX as usize);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    decoder
        .decode_headers()
        .map_err(|e| image_error(path, format!("{e:?}")))?;
    let (w, h) = decoder
        .dimensions()
        .ok_or_else(|| image_error(path, "no JPEG frame header"))?;
    // As the `image` crate asks: gray, RGB and their alpha forms as they
    // are, everything else (YCbCr, CMYK, …) converted to RGB.
    let out = match decoder.input_colorspace() {
        Some(c @ (ColorSpace::RGB | ColorSpace::RGBA | ColorSpace::Luma | ColorSpace::LumaA)) => c,
        _ => ColorSpace::RGB,
    };
    decoder.set_options(decoder.options().jpeg_set_out_colorspace(out));
    let header = ImageHeader {
        width: w,
        height: h,
        channels: out.num_components(),
        sample_bytes: 1,
    };
    Ok((header, Pixels::Jpeg(Box::new(decoder))))
}

impl Probe<'_> {
    /// The pixels, decoded into a checked buffer, as a `[C, H, W]` tensor
    /// with the channels of `mode`.
    fn decode(self, mode: ColorMode) -> Result<Tensor> {
        let (header, path) = (self.header, self.path);
        let samples = checked_count(&[header.width, header.height, header.channels])?;
        match self.pixels {
            Pixels::Jpeg(mut decoder) => {
                jpeg_structure(self.bytes).map_err(|reason| image_error(path, reason))?;
                if decoder.output_buffer_size() != Some(samples) {
                    return Err(image_error(
                        path,
                        "the decoder's size disagrees with the header",
                    ));
                }
                let mut raw = try_zeroed::<u8>(samples)?;
                decoder
                    .decode_into(&mut raw)
                    .map_err(|e| image_error(path, format!("{e:?}")))?;
                planar(&raw, &header, mode, |v| v as f32 / 255.0)
            }
            Pixels::Other(decoder) => {
                if decoder.total_bytes() != (samples * header.sample_bytes) as u64 {
                    return Err(image_error(
                        path,
                        "the decoder's size disagrees with the header",
                    ));
                }
                if header.sample_bytes == 1 {
                    let mut raw = try_zeroed::<u8>(samples)?;
                    decoder
                        .read_image_boxed(&mut raw)
                        .map_err(|e| image_error(path, e))?;
                    planar(&raw, &header, mode, |v| v as f32 / 255.0)
                } else {
                    // Native-endian u16 samples, as `read_image` writes them.
                    let mut raw = try_zeroed::<u16>(samples)?;
                    decoder
                        .read_image_boxed(bytemuck::cast_slice_mut(&mut raw))
                        .map_err(|e| image_error(path, e))?;
                    planar(&raw, &header, mode, |v| v as f32 / 65535.0)
                }
            }
        }
    }
}

/// Walks a JPEG's markers from the start-of-image to the end-of-image
/// marker, over every segment and every scan's entropy-coded data; a file
/// that ends before the end-of-image marker is truncated. (In scan data a
/// 0xFF byte is followed by a stuffed 0x00 or a restart marker; anything
/// else is the next marker.) The scans must also be long enough for the
/// frame: every 8×8 block of the largest component costs at least one bit
/// (its DC code, whatever the mode), so a frame that claims more rows than
/// its scans hold (which zune-jpeg fills with grey even in strict mode)
/// is refused.
fn jpeg_structure(bytes: &[u8]) -> std::result::Result<(), String> {
    let truncated = |at: usize| {
        format!(
            "the image file is truncated: it ends ({} bytes) before the JPEG's end-of-image marker (at byte {at})",
            bytes.len()
        )
    };
    if bytes.get(..2) != Some(&[0xFF, 0xD8]) {
        return Err("no JPEG start-of-image marker".into());
    }
    let (mut i, mut frame, mut scan_bytes) = (2, None, 0usize);
    loop {
        // Extraneous bytes before a marker are skipped, as libjpeg does.
        let Some(ff) = bytes[i..].iter().position(|&b| b == 0xFF) else {
            return Err(truncated(bytes.len()));
        };
        i += ff;
        while bytes.get(i) == Some(&0xFF) {
            i += 1;
        }
        let Some(&code) = bytes.get(i) else {
            return Err(truncated(i));
        };
        i += 1;
        match code {
            0xD9 => return scans_cover_frame(frame, scan_bytes),
            // Markers without a length: restarts, TEM, a stray stuffing.
            0xD0..=0xD7 | 0x01 | 0x00 => continue,
            _ => {}
        }
        let Some(len) = bytes.get(i..i + 2) else {
            return Err(truncated(i));
        };
        let len = u16::from_be_bytes([len[0], len[1]]) as usize;
        if len < 2 {
            return Err(format!("a JPEG segment at byte {i} has length {len}"));
        }
        // A frame header (SOF0–SOF15 but DHT, JPG and DAC): P, Y, X.
        if matches!(code, 0xC0..=0xCF) && !matches!(code, 0xC4 | 0xC8 | 0xCC) {
            if let Some(f) = bytes.get(i + 3..i + 7) {
                let h = u16::from_be_bytes([f[0], f[1]]) as usize;
                let w = u16::from_be_bytes([f[2], f[3]]) as usize;
                frame = frame.or(Some((w, h)));
            }
        }
        i += len;
        if i > bytes.len() {
            return Err(truncated(i));
        }
        if code == 0xDA {
            let end = scan_end(bytes, i).ok_or_else(|| truncated(bytes.len()))?;
            scan_bytes += end - i;
            i = end;
        }
    }
}

/// Whether scans of `scan_bytes` entropy-coded bytes can hold a frame of
/// `(width, height)`: at least one bit per 8×8 block.
fn scans_cover_frame(
    frame: Option<(usize, usize)>,
    scan_bytes: usize,
) -> std::result::Result<(), String> {
    let Some((w, h)) = frame else {
        return Err("no JPEG frame header".into());
    };
    let blocks = w.div_ceil(8) * h.div_ceil(8);
    if scan_bytes.saturating_mul(8) < blocks {
        return Err(format!(
            "the JPEG's scan data ({scan_bytes} bytes) cannot hold the {blocks} blocks of a {w}×{h} image: \
             the file is truncated or corrupt"
        ));
    }
    Ok(())
}

/// Where the entropy-coded data starting at `i` ends: the 0xFF of the
/// next marker other than a stuffed byte or a restart; `None` when the
/// file ends first.
fn scan_end(bytes: &[u8], mut i: usize) -> Option<usize> {
    loop {
        i += bytes.get(i..)?.iter().position(|&b| b == 0xFF)?;
        match *bytes.get(i + 1)? {
            0x00 | 0xD0..=0xD7 => i += 2,
            0xFF => i += 1,
            _ => return Some(i),
        }
    }
}

/// Interleaved samples (HWC, `header.channels` per pixel) to a planar
/// `[C, H, W]` f32 tensor with the channels of `mode`: gray repeated into
/// R, G and B, alpha dropped for RGB, an opaque alpha (1) added for RGBA.
fn planar<T: Copy>(
    hwc: &[T],
    header: &ImageHeader,
    mode: ColorMode,
    to_unit: impl Fn(T) -> f32,
) -> Result<Tensor> {
    let src = header.channels;
    let shape = header.tensor_shape(mode);
    let plane = checked_count(&[header.height, header.width])?;
    if hwc.len() != checked_count(&[plane, src])? {
        return Err(Error::InvalidArgument {
            op: "read_image",
            msg: format!("{} samples for {plane} pixels of {src} channels", hwc.len()),
        });
    }
    // The source channel of each output channel (`None`: opaque alpha).
    let sources: Vec<Option<usize>> = match mode {
        ColorMode::Unchanged => (0..src).map(Some).collect(),
        ColorMode::Rgb | ColorMode::Rgba => {
            let mut s: Vec<Option<usize>> =
                (0..3).map(|c| Some(if src < 3 { 0 } else { c })).collect();
            if mode == ColorMode::Rgba {
                s.push(match src {
                    2 => Some(1),
                    4 => Some(3),
                    _ => None,
                });
            }
            s
        }
    };
    let mut chw = try_vec::<f32>(checked_count(&[plane, shape[0]])?)?;
    for source in sources {
        match source {
            Some(c) => chw.extend(hwc.iter().skip(c).step_by(src).map(|&v| to_unit(v))),
            None => chw.extend(std::iter::repeat_n(1.0, plane)),
        }
    }
    Tensor::from_vec(chw, &shape, Device::Cpu)
}

/// torchvision's `to_tensor` for 8-bit pixels: `hwc` holds `height × width
/// × channels` samples, row by row, channels interleaved; the result is a
/// `[channels, height, width]` f32 tensor of `v / 255` on the CPU.
pub fn to_tensor(hwc: &[u8], height: usize, width: usize, channels: usize) -> Result<Tensor> {
    if channels == 0 || Some(hwc.len()) != checked_count(&[height, width, channels]).ok() {
        return Err(Error::InvalidArgument {
            op: "to_tensor",
            msg: format!(
                "{} samples for a {height}×{width} image of {channels} channels",
                hwc.len()
            ),
        });
    }
    let header = ImageHeader {
        width,
        height,
        channels,
        sample_bytes: 1,
    };
    planar(hwc, &header, ColorMode::Unchanged, |v| v as f32 / 255.0)
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
    let interleave = |max: f32| -> Result<Vec<f32>> {
        let mut out = try_zeroed::<f32>(checked_count(&[c, plane])?)?;
        for (ch, chunk) in values.chunks_exact(plane).enumerate() {
            for (p, &x) in chunk.iter().enumerate() {
                out[p * c + ch] = (x * max + 0.5).clamp(0.0, max);
            }
        }
        Ok(out)
    };
    let (bytes, bit_depth) = match depth {
        PngDepth::Eight => (
            {
                let values = interleave(255.0)?;
                try_collect(values.len(), values.into_iter().map(|v| v as u8))?
            },
            png::BitDepth::Eight,
        ),
        // PNG stores 16-bit samples big-endian.
        PngDepth::Sixteen => (
            {
                let values = interleave(65535.0)?;
                let n = checked_count(&[values.len(), 2])?;
                try_collect(n, values.into_iter().flat_map(|v| (v as u16).to_be_bytes()))?
            },
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

/// Writes 8-bit RGB pixels (row by row, `width · height · 3` bytes) as a
/// PNG file with the [`PNG_MARKER`] text chunk (a rendered plot, say).
pub fn write_rgb8_png(path: &Path, (width, height): (u32, u32), rgb: &[u8]) -> Result<()> {
    let expected = (width as usize)
        .checked_mul(height as usize)
        .and_then(|n| n.checked_mul(3));
    if expected != Some(rgb.len()) {
        return Err(image_error(
            path,
            format!("{} bytes are not {width}×{height} RGB pixels", rgb.len()),
        ));
    }
    encode_png(
        path,
        (width, height),
        png::ColorType::Rgb,
        png::BitDepth::Eight,
        rgb,
    )
}

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
    check_outputs(
        outputs,
        option,
        |path| is_leangrad_png(path),
        "a PNG leangrad writes carries the text chunk `Software: leangrad`",
    )
}

/// [`check_png_outputs`] for files of any kind: an existing file is
/// replaced only when `is_ours` says leangrad wrote it; `marked_by` says,
/// in the error, how leangrad marks its files of that kind.
pub fn check_outputs(
    outputs: impl IntoIterator<Item = PathBuf>,
    option: &str,
    is_ours: impl Fn(&Path) -> bool,
    marked_by: &str,
) -> Result<()> {
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
            Ok(_) if is_ours(path) => {}
            Ok(_) => {
                return refuse(
                    path,
                    format!(
                        "a file leangrad did not write is there ({marked_by}), and leangrad \
                         never overwrites one"
                    ),
                )
            }
        }
    }
    Ok(())
}
