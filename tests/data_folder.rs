//! ImageFolder against torchvision's rules (class and file order checked
//! with torchvision's `find_classes`/`make_dataset` on the same tree), and
//! unreadable files: typed errors naming the file, or skipped by the loader.

use std::path::{Path, PathBuf};

use leangrad::data::{write_png, DataLoader, ImageFolder, PngDepth, Resize};
use leangrad::{Device, Error, Tensor};

/// A fresh empty folder for one test.
fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-folder-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn touch(root: &Path, rel: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, b"\n").unwrap();
}

/// A `h × w` RGB PNG filled with `value` (a multiple of 1/255, so it reads
/// back exactly).
fn png(root: &Path, rel: &str, value: f32, h: usize, w: usize) -> PathBuf {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let t = Tensor::from_vec(vec![value; 3 * h * w], &[3, h, w], Device::Cpu).unwrap();
    write_png(&t, &path, PngDepth::Eight).unwrap();
    path
}

#[test]
fn classes_and_files_are_ordered_as_torchvision_orders_them() {
    let root = tempdir("order");
    for f in [
        "A/2.png",
        "A/10.png",
        "A/b.PNG",
        "A/a.Jpeg",
        "A/notes.txt",
        "A/x.jpgx",
        "b/z.bmp",
        "b/s/m.png",
        "b/s-t/n.png",
        "b/s/u/o.png",
        "Z10/c.tif",
        "Z9/d.webp",
        "Z9/e.png",
        "top.png",
    ] {
        touch(&root, f);
    }
    let folder = ImageFolder::new(&root).unwrap();
    // Plain string order: upper case first, "Z10" before "Z9".
    assert_eq!(folder.classes(), ["A", "Z10", "Z9", "b"]);
    assert_eq!(folder.class_index("Z9"), Some(2));
    assert_eq!(folder.class_index("c"), None);
    let samples: Vec<(String, usize)> = folder
        .samples()
        .iter()
        .map(|(p, c)| {
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (rel, *c)
        })
        .collect();
    // What torchvision's make_dataset lists for this tree: the folders of
    // os.walk sorted as strings ("b/s" < "b/s-t" < "b/s/u", since '-' < '/'),
    // each one's files sorted; extensions case-insensitive; no .txt, .jpgx,
    // nor files directly in the root.
    let want = [
        ("A/10.png", 0),
        ("A/2.png", 0),
        ("A/a.Jpeg", 0),
        ("A/b.PNG", 0),
        ("Z10/c.tif", 1),
        ("Z9/d.webp", 2),
        ("Z9/e.png", 2),
        ("b/z.bmp", 3),
        ("b/s/m.png", 3),
        ("b/s-t/n.png", 3),
        ("b/s/u/o.png", 3),
    ];
    let want: Vec<(String, usize)> = want.iter().map(|(p, c)| (p.to_string(), *c)).collect();
    assert_eq!(samples, want);
    assert_eq!(folder.len(), 11);
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn get_reads_the_image_and_its_class() {
    let root = tempdir("get");
    png(&root, "cat/1.png", 10.0 / 255.0, 3, 5);
    png(&root, "cat/2.png", 20.0 / 255.0, 4, 4);
    let bmp = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data/rgb_9x11.bmp");
    std::fs::create_dir_all(root.join("dog")).unwrap();
    std::fs::copy(&bmp, root.join("dog/3.bmp")).unwrap();
    let folder = ImageFolder::new(&root).unwrap();
    let (img, class) = folder.get(1).unwrap();
    assert_eq!((img.shape(), class), (&[3, 4, 4][..], 0));
    assert!(img
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|&v| v == 20.0 / 255.0));
    let (img, class) = folder.get(2).unwrap();
    assert_eq!((img.shape(), class), (&[3, 9, 11][..], 1));
    assert!(matches!(
        folder.get(3),
        Err(Error::IndexOutOfRange {
            index: 3,
            size: 3,
            ..
        })
    ));
    // Images of different sizes cannot share a batch...
    let loader = DataLoader::new(ImageFolder::new(&root).unwrap(), 3).unwrap();
    let err = loader.epoch(0).next().unwrap().unwrap_err();
    assert!(err.to_string().contains("differ in shape"), "{err}");
    // ...until a transform gives them one size.
    let resized = ImageFolder::new(&root)
        .unwrap()
        .with_transform(Resize::exact(4, 4));
    let batch = DataLoader::new(resized, 3)
        .unwrap()
        .epoch(0)
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(batch.images.shape(), &[3, 3, 4, 4]);
    assert_eq!(batch.labels.to_vec::<i64>().unwrap(), [0, 0, 1]);
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn unusable_folders_are_errors_naming_them() {
    let root = tempdir("unusable");
    let missing = root.join("nope");
    let err = ImageFolder::new(&missing).err().unwrap();
    assert!(
        matches!(&err, Error::Image { path, .. } if path == &missing),
        "{err}"
    );
    touch(&root, "loose.png");
    let err = ImageFolder::new(&root).err().unwrap();
    assert!(err.to_string().contains("no class folders"), "{err}");
    touch(&root, "full/a.png");
    touch(&root, "empty/readme.txt");
    let err = ImageFolder::new(&root).err().unwrap();
    assert!(err.to_string().contains("empty"), "{err}");
    assert!(!err.to_string().contains("full"), "{err}");
    std::fs::remove_dir_all(&root).ok();
}

/// A class folder with three good 2×2 PNGs, a PNG cut in half and a text
/// file named `.jpg`; returns (root, truncated, fake).
fn folder_with_bad_files(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let root = tempdir(name);
    for (i, v) in [(1, 10.0), (2, 20.0), (4, 40.0)] {
        png(&root, &format!("only/{i}.png"), v / 255.0, 2, 2);
    }
    let truncated = png(&root, "only/3.png", 0.5, 2, 2);
    let bytes = std::fs::read(&truncated).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let fake = root.join("only/0.jpg");
    std::fs::write(&fake, b"this is not a JPEG, only text").unwrap();
    (root, truncated, fake)
}

#[test]
fn bad_files_are_typed_errors_naming_the_file() {
    let (root, truncated, fake) = folder_with_bad_files("bad");
    let folder = ImageFolder::new(&root).unwrap();
    // Sample order: 0.jpg, 1.png, 2.png, 3.png (truncated), 4.png.
    for (index, bad) in [(0, &fake), (3, &truncated)] {
        match folder.get(index) {
            Err(Error::Image { path, reason }) => {
                assert_eq!(&path, bad);
                assert!(!reason.is_empty());
            }
            other => panic!("sample {index}: expected Error::Image, got {other:?}"),
        }
        let text = folder.get(index).unwrap_err().to_string();
        assert!(text.contains(&*bad.to_string_lossy()), "{text}");
    }
    // The loader hands the error on, for the batch holding the file.
    let loader = DataLoader::new(folder, 2).unwrap();
    let results: Vec<_> = loader.epoch(0).collect();
    assert_eq!(results.len(), 3);
    assert!(matches!(&results[0], Err(Error::Image { path, .. }) if path == &fake));
    assert!(matches!(&results[1], Err(Error::Image { path, .. }) if path == &truncated));
    assert_eq!(results[2].as_ref().unwrap().indices, [4]);
    assert!(loader.skipped_files().is_empty());
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn skip_bad_files_leaves_them_out_of_every_epoch() {
    let (root, truncated, fake) = folder_with_bad_files("skip");
    let loader = DataLoader::new(ImageFolder::new(&root).unwrap(), 2)
        .unwrap()
        .shuffle(true)
        .seed(3)
        .skip_bad_files(true);
    for epoch in 0..3 {
        let mut seen = Vec::new();
        for batch in loader.epoch(epoch) {
            let batch = batch.unwrap();
            assert_eq!(batch.images.shape()[0], batch.indices.len());
            let pixels = batch.images.to_vec::<f32>().unwrap();
            for (k, &i) in batch.indices.iter().enumerate() {
                // Sample i (1, 2 or 4) is filled with 10·i / 255.
                assert_eq!(pixels[k * 12], (10 * i) as f32 / 255.0);
            }
            seen.extend(batch.indices);
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 2, 4], "epoch {epoch}");
    }
    // Each skipped file is listed (and was warned about) once.
    let mut want = vec![fake, truncated];
    want.sort();
    assert_eq!(loader.skipped_files(), want);
    std::fs::remove_dir_all(&root).ok();
}
