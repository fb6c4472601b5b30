//! Synthetic inputs for the examples, so that each one runs on a fresh
//! machine without any file: coloured-noise images written as PNG.
// Each example uses a part of this module.
#![allow(dead_code)]

use leangrad::data::{write_png, PngDepth};
use leangrad::{DType, Device, Result, Tensor};
use std::path::{Path, PathBuf};

/// A `[3, size, size]` image in [0, 1]: noise around the colour `rgb`.
pub fn noisy_image(rgb: [f32; 3], size: usize, seed: u64) -> Result<Tensor> {
    let colour = Tensor::from_vec(rgb.to_vec(), &[3, 1, 1], Device::Cpu)?;
    let noise = Tensor::rand_range(&[3, size, size], -0.25, 0.25, DType::F32, Device::Cpu, seed)?;
    noise.add(&colour)?.clamp(0.0, 1.0)
}

/// Writes `per_class` noisy images of each colour into `dir/<class>/`, as
/// an `ImageFolder` wants them, and returns `dir`.
pub fn image_folder(
    dir: &Path,
    classes: &[(&str, [f32; 3])],
    per_class: usize,
    size: usize,
) -> Result<PathBuf> {
    for (c, (name, rgb)) in classes.iter().enumerate() {
        let class_dir = dir.join(name);
        std::fs::create_dir_all(&class_dir).map_err(|e| leangrad::Error::Image {
            path: class_dir.clone(),
            reason: e.to_string(),
        })?;
        for i in 0..per_class {
            let image = noisy_image(*rgb, size, (c * 1000 + i) as u64)?;
            write_png(
                &image,
                class_dir.join(format!("{i:03}.png")),
                PngDepth::Eight,
            )?;
        }
    }
    Ok(dir.to_path_buf())
}

/// A fresh folder under the system's temporary directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-example-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
