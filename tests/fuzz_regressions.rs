//! Inputs the fuzz suites found that break a rule in code outside the
//! data and configuration readers, kept as regression cases that guard
//! their fixes.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-regress-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Found by tests/fuzz_cli.rs (a mutation that moved `--out` onto the
/// fixture folder): `finetune --out DIR` with an existing folder that is
/// not a checkpoint replaces the folder whole, deleting the user's files
/// in it (`Checkpoint::save` renames it to `DIR.previous` and removes
/// that). Now refused before training. Kept:
/// tests/fixtures/fuzz/finetune_out_existing_folder.txt.
#[test]
fn finetune_out_keeps_an_existing_folder() {
    let dir = tempdir("out-folder");
    let data = dir.join("data");
    for class in ["a", "b"] {
        std::fs::create_dir_all(data.join(class)).unwrap();
        std::fs::copy(
            fixture("data/rgb_23x31.png"),
            data.join(class).join("x.png"),
        )
        .unwrap();
    }
    let victim = dir.join("photos");
    std::fs::create_dir_all(&victim).unwrap();
    let notes = victim.join("notes.txt");
    std::fs::write(&notes, "not leangrad's").unwrap();
    let case = std::fs::read_to_string(fixture("fuzz/finetune_out_existing_folder.txt")).unwrap();
    let args: Vec<String> = case
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            l.replace("{data}", &data.display().to_string())
                .replace("{out}", &victim.display().to_string())
        })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args(&args)
        .output()
        .unwrap();
    // Refusing is fine, writing the checkpoint beside the file is fine;
    // deleting the user's file is not.
    assert!(
        notes.is_file(),
        "{} was deleted ({:?}; {})",
        notes.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
