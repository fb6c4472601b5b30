//! torchvision's `ImageFolder`: `root/<class>/…/<file>`, one class per
//! sub-folder of `root`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::dataset::Dataset;
use super::image::{read_image_as, read_image_with, ColorMode};
use super::random::SampleRng;
use super::transforms::Transform;
use crate::{Error, Result, Tensor};

/// The file extensions torchvision's `ImageFolder` accepts (compared
/// case-insensitively). PNG, JPEG and BMP decode; the others are listed (so
/// sample numbering matches torchvision's) but fail to decode with
/// [`Error::Image`].
pub const IMG_EXTENSIONS: [&str; 9] = [
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
];

fn folder_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Image {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Whether `name` ends with one of [`IMG_EXTENSIONS`], ignoring case.
pub fn has_image_extension(name: &str) -> bool {
    let lower = name.to_lowercase();
    IMG_EXTENSIONS.iter().any(|ext| lower.ends_with(ext))
}

/// The names of the entries of `dir` and whether each is a folder
/// (following symbolic links, as `os.walk(followlinks=True)` does).
fn entries(dir: &Path) -> Result<Vec<(String, bool)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| folder_error(dir, e))? {
        let entry = entry.map_err(|e| folder_error(dir, e))?;
        let is_dir = entry.path().is_dir();
        out.push((entry.file_name().to_string_lossy().into_owned(), is_dir));
    }
    Ok(out)
}

/// Every folder under `dir` (itself included), depth first.
fn all_folders(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) -> Result<()> {
    // A symbolic-link loop would recurse forever; no real tree is this deep.
    if depth > 64 {
        return Err(folder_error(dir, "folders nested more than 64 deep"));
    }
    out.push(dir.to_path_buf());
    for (name, is_dir) in entries(dir)? {
        if is_dir {
            all_folders(&dir.join(name), out, depth + 1)?;
        }
    }
    Ok(())
}

/// The image files of one class folder, in torchvision's order: the
/// folders of `sorted(os.walk(class_dir))` (sorted by path as a string),
/// each one's files sorted by name.
fn class_files(class_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut folders = Vec::new();
    all_folders(class_dir, &mut folders, 0)?;
    folders.sort_by_key(|p| p.to_string_lossy().into_owned());
    let mut files = Vec::new();
    for folder in folders {
        let mut names: Vec<String> = entries(&folder)?
            .into_iter()
            .filter(|(name, is_dir)| !is_dir && has_image_extension(name))
            .map(|(name, _)| name)
            .collect();
        names.sort();
        files.extend(names.into_iter().map(|n| folder.join(n)));
    }
    Ok(files)
}

/// Images in one sub-folder per class (torchvision's `ImageFolder`):
/// classes are the sub-folder names in plain string order, numbered from 0;
/// samples are each class's files (any depth below it, sorted as
/// torchvision walks them) with an image extension, class after class.
/// Files are read when a sample is asked for, in RGB unless
/// [`ImageFolder::color_mode`] says otherwise, then transformed.
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    samples: Vec<(PathBuf, usize)>,
    transform: Option<Arc<dyn Transform>>,
    mode: ColorMode,
}

impl ImageFolder {
    /// Indexes `root` (reads no image yet). A root that is not a readable
    /// folder, one without class sub-folders, or a class without image
    /// files is [`Error::Image`] naming the folder.
    pub fn new(root: impl AsRef<Path>) -> Result<ImageFolder> {
        let root = root.as_ref().to_path_buf();
        let mut classes: Vec<String> = entries(&root)?
            .into_iter()
            .filter(|(_, is_dir)| *is_dir)
            .map(|(name, _)| name)
            .collect();
        classes.sort();
        if classes.is_empty() {
            return Err(folder_error(&root, "no class folders in it"));
        }
        let mut samples = Vec::new();
        let mut empty = Vec::new();
        for (index, class) in classes.iter().enumerate() {
            let files = class_files(&root.join(class))?;
            if files.is_empty() {
                empty.push(class.clone());
            }
            samples.extend(files.into_iter().map(|f| (f, index)));
        }
        if !empty.is_empty() {
            return Err(folder_error(
                &root,
                format!(
                    "no image files (extensions {}) in the class folders {}",
                    IMG_EXTENSIONS.join(", "),
                    empty.join(", ")
                ),
            ));
        }
        Ok(ImageFolder {
            root,
            classes,
            samples,
            transform: None,
            mode: ColorMode::Rgb,
        })
    }

    /// The dataset with `transform` applied to every image read.
    pub fn with_transform(mut self, transform: impl Transform + 'static) -> ImageFolder {
        self.transform = Some(Arc::new(transform));
        self
    }

    /// The dataset reading images with the channels of `mode`.
    pub fn color_mode(mut self, mode: ColorMode) -> ImageFolder {
        self.mode = mode;
        self
    }

    /// The folder indexed.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The class names; class `i` is `classes()[i]`.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The index of the class called `name`.
    pub fn class_index(&self, name: &str) -> Option<usize> {
        self.classes.binary_search_by(|c| c.as_str().cmp(name)).ok()
    }

    /// Every sample's file and class index, in sample order.
    pub fn samples(&self) -> &[(PathBuf, usize)] {
        &self.samples
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there are no samples (never, for a folder that indexed).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Sample `i`: its image (read, then transformed with random choices
    /// from seed 0) and class index. An index past the end is
    /// [`Error::IndexOutOfRange`]; a file that does not decode,
    /// [`Error::Image`] naming it.
    pub fn get(&self, i: usize) -> Result<(Tensor, usize)> {
        self.sample(i, &mut SampleRng::for_sample(0, 0, i as u64))
    }
}

impl Dataset for ImageFolder {
    fn len(&self) -> usize {
        self.samples.len()
    }

    fn sample(&self, index: usize, rng: &mut SampleRng) -> Result<(Tensor, usize)> {
        let (path, class) = self.samples.get(index).ok_or(Error::IndexOutOfRange {
            op: "ImageFolder::get",
            index: index as i64,
            size: self.samples.len(),
        })?;
        // With a transform, its memory is checked from the header first.
        let image = match &self.transform {
            Some(t) => read_image_with(path, self.mode, t.as_ref(), rng)?,
            None => read_image_as(path, self.mode)?,
        };
        Ok((image, *class))
    }
}
