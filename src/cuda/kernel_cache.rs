//! The on-disk cache of compiled kernel images (PTX text or CUBIN bytes).
//!
//! NVRTC takes seconds per kernel file, and every process that opens a
//! device (each test binary, each `leangrad` run) would otherwise compile
//! the same files again. An entry is keyed by a SHA-256 of everything that
//! decides NVRTC's output — the text compiled (prelude, `#line` marker and
//! the file's source), NVRTC's version, the target architecture, the image
//! kind and the options (which name the include folder) — so a stale entry
//! is never found, only a missing one.
//!
//! Where: `LEANGRAD_KERNEL_CACHE` if set, else
//! `$XDG_CACHE_HOME/leangrad/kernels`, else `$HOME/.cache/leangrad/kernels`;
//! the first of these that can be created and written to is used, and with
//! none the kernels are compiled without caching: the cache never makes a
//! compile fail.
//!
//! Entries are written to a temporary file and renamed into place, so a
//! process running in parallel sees either no entry or a whole one. Each
//! entry starts with a header (magic, format, key, payload length, SHA-256
//! of the payload); an entry that does not match it — truncated, corrupt,
//! or for another key — is compiled again and rewritten.

use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable naming the cache folder.
pub const CACHE_ENV: &str = "LEANGRAD_KERNEL_CACHE";

const MAGIC: &[u8; 8] = b"LGKERNEL";
/// Bump when the entry layout changes.
const FORMAT: u32 = 1;
/// magic + format + key + payload length + payload digest.
const HEADER_LEN: usize = 8 + 4 + 32 + 8 + 32;

/// The folders to try, in order, read from `env` (the process environment
/// in [`cache_dir`]; a function so tests can pass their own).
fn candidates(env: impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let set = |var: &str| env(var).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut dirs = Vec::new();
    if let Some(d) = set(CACHE_ENV) {
        dirs.push(d);
    }
    if let Some(d) = set("XDG_CACHE_HOME") {
        dirs.push(d.join("leangrad/kernels"));
    }
    if let Some(d) = set("HOME") {
        dirs.push(d.join(".cache/leangrad/kernels"));
    }
    dirs
}

/// Whether `dir` exists (created if need be) and a file can be written in it.
fn writable(dir: &Path) -> bool {
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    let probe = temp_name(dir, "probe");
    let ok = std::fs::File::create(&probe).is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// The cache folder of this process (chosen once), or `None` when no
/// candidate is writable: then kernels are compiled without caching.
pub fn cache_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        candidates(|v| std::env::var_os(v))
            .into_iter()
            .find(|d| writable(d))
    })
    .as_deref()
}

/// A fresh name in `dir` for a temporary file: unique per process and call,
/// so concurrent writers never share one.
fn temp_name(dir: &Path, what: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{what}.{}.{n}.tmp", std::process::id()))
}

/// The key of an entry: SHA-256 over `parts`, each length-prefixed so that
/// no two different part lists hash the same bytes.
pub fn key(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"leangrad kernel cache");
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The payload of the entry at `path` if it is whole and written for `key`.
fn read_entry(path: &Path, key: &[u8; 32]) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
        return None;
    }
    let format = u32::from_le_bytes(bytes[8..12].try_into().ok()?);
    let len = u64::from_le_bytes(bytes[44..52].try_into().ok()?);
    let payload = &bytes[HEADER_LEN..];
    let whole = format == FORMAT
        && &bytes[12..44] == key
        && len == payload.len() as u64
        && bytes[52..84] == sha256(payload);
    whole.then(|| payload.to_vec())
}

/// Writes the entry for `key` at `path` through a temporary file renamed
/// into place. Errors are ignored: a missing entry is compiled next time.
fn write_entry(path: &Path, key: &[u8; 32], payload: &[u8]) {
    let Some(dir) = path.parent() else {
        return;
    };
    let tmp = temp_name(dir, "entry");
    let written = (|| -> std::io::Result<()> {
        // Again here: the folder may have been removed since it was chosen.
        std::fs::create_dir_all(dir)?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(MAGIC)?;
        f.write_all(&FORMAT.to_le_bytes())?;
        f.write_all(key)?;
        f.write_all(&(payload.len() as u64).to_le_bytes())?;
        f.write_all(&sha256(payload))?;
        f.write_all(payload)?;
        f.flush()
    })();
    if written.is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The entry `name` (a file name: readable prefix + key) for `key` in
/// `dir`, or, when it is missing or damaged (or `dir` is `None`), the
/// result of `compile`, which is then stored. Compile errors are returned
/// and nothing is stored for them.
pub fn get_or_compile<E>(
    dir: Option<&Path>,
    name: &str,
    key: &[u8; 32],
    compile: impl FnOnce() -> Result<Vec<u8>, E>,
) -> Result<Vec<u8>, E> {
    let Some(dir) = dir else {
        return compile();
    };
    let path = dir.join(name);
    if let Some(payload) = read_entry(&path, key) {
        return Ok(payload);
    }
    let payload = compile()?;
    write_entry(&path, key, &payload);
    Ok(payload)
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A fresh, empty folder for one test.
    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "leangrad-kernel-cache-{test}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn sha256_matches_the_fips_vectors() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        // A million 'a's, fed in uneven pieces across block boundaries.
        let mut h = Sha256::new();
        let chunk = [b'a'; 997];
        let mut left = 1_000_000;
        while left > 0 {
            let n = left.min(chunk.len());
            h.update(&chunk[..n]);
            left -= n;
        }
        assert_eq!(
            hex(&h.finalize()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }

    #[test]
    fn key_separates_its_parts() {
        assert_ne!(key(&[b"ab", b"c"]), key(&[b"a", b"bc"]));
        assert_eq!(key(&[b"ab", b"c"]), key(&[b"ab", b"c"]));
    }

    #[test]
    fn second_lookup_hits_and_damaged_entries_are_recompiled() {
        let dir = scratch("hits");
        let compiles = Cell::new(0);
        let compile = |payload: &'static [u8]| {
            let compiles = &compiles;
            move || {
                compiles.set(compiles.get() + 1);
                Ok::<_, ()>(payload.to_vec())
            }
        };
        let k = key(&[b"conv.cu", b"compute_80"]);
        let get = |c| get_or_compile(Some(&dir), "conv.cu.entry", &k, c).unwrap();
        assert_eq!(get(compile(b"image one")), b"image one");
        assert_eq!(compiles.get(), 1);
        // Found on disk: not compiled again (the closure's payload differs
        // to prove the stored one is returned).
        assert_eq!(get(compile(b"other")), b"image one");
        assert_eq!(compiles.get(), 1);

        let path = dir.join("conv.cu.entry");
        let whole = std::fs::read(&path).unwrap();
        assert_eq!(whole.len(), HEADER_LEN + b"image one".len());
        let mut corrupt = whole.clone();
        *corrupt.last_mut().unwrap() ^= 1;
        for damaged in [
            corrupt,
            whole[..whole.len() - 3].to_vec(),
            whole[..20].to_vec(),
        ] {
            std::fs::write(&path, damaged).unwrap();
            let before = compiles.get();
            assert_eq!(get(compile(b"image two")), b"image two");
            assert_eq!(compiles.get(), before + 1, "a damaged entry is recompiled");
            // ... and rewritten whole.
            assert_eq!(get(compile(b"other")), b"image two");
            assert_eq!(compiles.get(), before + 1);
            std::fs::write(&path, &whole).unwrap();
        }

        // An entry written for another key under the same name is not used.
        let other = key(&[b"conv.cu", b"compute_90"]);
        let got = get_or_compile(Some(&dir), "conv.cu.entry", &other, compile(b"for 90"));
        assert_eq!(got.unwrap(), b"for 90");
        assert_eq!(compiles.get(), 5);
        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("conv.cu.entry")]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn compile_errors_are_returned_and_not_stored() {
        let dir = scratch("errors");
        let k = key(&[b"broken.cu"]);
        let r = get_or_compile(Some(&dir), "broken", &k, || Err::<Vec<u8>, _>("log"));
        assert_eq!(r, Err("log"));
        assert!(!dir.join("broken").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unwritable_folder_compiles_without_caching() {
        let dir = scratch("unwritable");
        // A folder below a plain file can be neither created nor written.
        let file = dir.join("plain");
        std::fs::write(&file, b"x").unwrap();
        let below = file.join("kernels");
        assert!(!writable(&below));
        let compiles = Cell::new(0);
        for _ in 0..2 {
            let got = get_or_compile(Some(&below), "e", &key(&[b"x"]), || {
                compiles.set(compiles.get() + 1);
                Ok::<_, ()>(b"image".to_vec())
            });
            assert_eq!(got.unwrap(), b"image");
        }
        assert_eq!(compiles.get(), 2);
        assert!(writable(&dir.join("made/on/demand")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn folders_are_tried_in_the_documented_order() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |v: &str| {
                vars.iter()
                    .find(|(k, _)| *k == v)
                    .map(|(_, val)| OsString::from(val))
            }
        };
        assert_eq!(
            candidates(env(&[
                ("HOME", "/h"),
                ("XDG_CACHE_HOME", "/x"),
                (CACHE_ENV, "/c")
            ])),
            [
                PathBuf::from("/c"),
                PathBuf::from("/x/leangrad/kernels"),
                PathBuf::from("/h/.cache/leangrad/kernels")
            ]
        );
        assert_eq!(
            candidates(env(&[("HOME", "/h"), (CACHE_ENV, "")])),
            [PathBuf::from("/h/.cache/leangrad/kernels")]
        );
        assert!(candidates(env(&[])).is_empty());
    }
}
