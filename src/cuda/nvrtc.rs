//! Run-time compilation of `kernels/*.cu` with NVRTC.
//!
//! The sources are embedded in the binary with `include_str!`; each is
//! compiled with [`PRELUDE`] (`kernels/common.cuh`) and the kernel codes' declarations
//! ([`full_source`]) in front of it: for a
//! GPU, to a CUBIN for its compute capability (`sm_XY`; [`cubin_for`]); for
//! the simulated GPU and the compile check, to PTX for a virtual
//! architecture (`compute_XY`; [`ptx_for`], [`compile`]). Which one a
//! device gets is decided in `CudaDevice::open`. The kernels include
//! `cuda_fp16.h` / `cuda_bf16.h`, which NVRTC does not carry:
//! [`include_dir`] finds CUDA's include folder at run time.
//!
//! Compiled images are kept in memory for the process ([`image_for`]) and
//! on disk across processes ([`kernel_cache_dir`]: `LEANGRAD_KERNEL_CACHE`,
//! else `$XDG_CACHE_HOME/leangrad/kernels`, else
//! `$HOME/.cache/leangrad/kernels`), keyed by a SHA-256 of the compiled
//! text, NVRTC's version, the architecture and the options; without a
//! writable folder kernels are compiled every time, never an error.

use super::kernel_cache;
use crate::op_code::kernel_code_header;
use crate::{Device, Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Text put in front of every kernel file: types, layouts, conversions.
pub const PRELUDE: &str = include_str!("../../kernels/common.cuh");

/// Every kernel file, `(file name, source)`. `tests/kernels_nvrtc.rs`
/// checks that this lists every `kernels/*.cu` and that all compile.
pub const SOURCES: &[(&str, &str)] = &[
    ("cast.cu", include_str!("../../kernels/cast.cu")),
    ("compare.cu", include_str!("../../kernels/compare.cu")),
    ("copy.cu", include_str!("../../kernels/copy.cu")),
    (
        "elementwise.cu",
        include_str!("../../kernels/elementwise.cu"),
    ),
    ("index.cu", include_str!("../../kernels/index.cu")),
    ("loss.cu", include_str!("../ops/loss/loss.cu")),
    ("random.cu", include_str!("../../kernels/random.cu")),
    ("reduce.cu", include_str!("../../kernels/reduce.cu")),
    ("softmax.cu", include_str!("../ops/softmax/softmax.cu")),
    ("attention.cu", include_str!("../nn/attention/attention.cu")),
    ("flash.cu", include_str!("../nn/attention/flash/flash.cu")),
    ("conv.cu", include_str!("../nn/conv/conv.cu")),
    ("dropout.cu", include_str!("../nn/dropout/dropout.cu")),
    ("embedding.cu", include_str!("../nn/embedding/embedding.cu")),
    ("norm.cu", include_str!("../nn/norm/norm.cu")),
    ("optim.cu", include_str!("../optim/optim.cu")),
    ("pool.cu", include_str!("../nn/pool/pool.cu")),
    ("relu_mask.cu", include_str!("../ops/mask/relu_mask.cu")),
    ("rotary.cu", include_str!("../nn/rotary/rotary.cu")),
    ("upsample.cu", include_str!("../nn/upsample/upsample.cu")),
];

/// The environment variables naming CUDA's include folder, in the order
/// they are tried (the last two name a CUDA installation's root).
pub const INCLUDE_ENV: [&str; 4] = [
    "LEANGRAD_CUDA_INCLUDE",
    "CUDA_INCLUDE_DIR",
    "CUDA_HOME",
    "CUDA_PATH",
];

fn has_headers(dir: &Path) -> bool {
    dir.join("cuda_fp16.h").is_file() && dir.join("cuda_bf16.h").is_file()
}

/// The folders [`include_dir`] looks at, in order.
pub fn include_candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in INCLUDE_ENV {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let p = PathBuf::from(v);
            // The first two name the include folder, the others the root.
            dirs.push(if matches!(var, "CUDA_HOME" | "CUDA_PATH") {
                p.join("include")
            } else {
                p
            });
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    dirs.extend(pip_include_candidates());
    dirs
}

/// Where pip's CUDA 13 wheels put the headers (`site-packages/nvidia/cu13/
/// include`), for the Python installations found without running Python:
/// beside each `lib/python3.*` of the usual prefixes, `VIRTUAL_ENV`,
/// `~/.local` and pyenv versions.
fn pip_include_candidates() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = ["/usr", "/usr/local", "/opt/conda"]
        .iter()
        .map(PathBuf::from)
        .collect();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var) {
            prefixes.push(PathBuf::from(v));
        }
    }
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
        prefixes.push(home.join(".local"));
        if let Ok(versions) = std::fs::read_dir(home.join(".pyenv/versions")) {
            prefixes.extend(versions.flatten().map(|e| e.path()));
        }
    }
    let mut out = Vec::new();
    for prefix in prefixes {
        let Ok(libs) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        for lib in libs.flatten() {
            if !lib.file_name().to_string_lossy().starts_with("python3") {
                continue;
            }
            for packages in ["site-packages", "dist-packages"] {
                out.push(lib.path().join(packages).join("nvidia/cu13/include"));
            }
        }
    }
    out
}

/// CUDA's include folder (the one holding `cuda_fp16.h` and `cuda_bf16.h`),
/// or an error listing every place that was looked at.
pub fn include_dir() -> Result<PathBuf> {
    let candidates = include_candidates();
    if let Some(dir) = candidates.iter().find(|d| has_headers(d)) {
        return Ok(dir.clone());
    }
    let looked: Vec<String> = candidates
        .iter()
        .map(|d| format!("  {}", d.display()))
        .collect();
    Err(Error::DeviceUnavailable {
        device: Device::Cuda(0),
        reason: format!(
            "CUDA headers cuda_fp16.h/cuda_bf16.h not found; set {} to CUDA's include folder \
             (or install pip's nvidia-cuda-runtime). Looked in:\n{}",
            INCLUDE_ENV[0],
            looked.join("\n")
        ),
    })
}

/// Whether libnvrtc can be loaded (without loading it for good).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries dlopen on the library names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The source of kernel file `file` (a name from [`SOURCES`]).
fn source_of(file: &str) -> Result<&'static str> {
    SOURCES
        .iter()
        .find(|s| s.0 == file)
        .map(|s| s.1)
        .ok_or_else(|| Error::InvalidArgument {
            op: "nvrtc::compile",
            msg: format!("no kernel file named {file}"),
        })
}

/// The text NVRTC compiles for kernel file `file`: the prelude, the
/// kernel codes' C++ declarations ([`kernel_code_header`]), then the file
/// (its lines numbered from 1 in compiler messages).
pub fn full_source(file: &str, source: &str) -> String {
    let codes = kernel_code_header();
    format!("{PRELUDE}\n{codes}#line 1 \"{file}\"\n{source}")
}

/// `source` with the prelude in front, after checking that libnvrtc and
/// the headers are there.
fn prepare(file: &str, source: &str) -> Result<(String, PathBuf)> {
    if !nvrtc_present() {
        return Err(Error::DeviceUnavailable {
            device: Device::Cuda(0),
            reason: "cannot load libnvrtc (searched LD_LIBRARY_PATH and the ldconfig cache)".into(),
        });
    }
    let include = include_dir()?;
    Ok((full_source(file, source), include))
}

/// What NVRTC is asked to produce for a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// PTX text for a virtual architecture (`compute_XY`): what the
    /// simulated GPU (`gpusim/`) interprets; a real driver would JIT it.
    Ptx,
    /// A CUBIN for a real architecture (`sm_XY`): what a GPU loads. Unlike
    /// PTX, which a driver older than the NVRTC that wrote it refuses, a
    /// CUBIN loads on any driver of the same CUDA major version.
    Cubin,
}

impl ImageKind {
    /// The NVRTC architecture for compute capability `cc`: `compute_XY`
    /// for PTX, `sm_XY` for a CUBIN.
    pub fn arch(self, cc: (i32, i32)) -> String {
        match self {
            ImageKind::Ptx => format!("compute_{}{}", cc.0, cc.1),
            ImageKind::Cubin => format!("sm_{}{}", cc.0, cc.1),
        }
    }

    fn extension(self) -> &'static str {
        match self {
            ImageKind::Ptx => "ptx",
            ImageKind::Cubin => "cubin",
        }
    }
}

/// No contraction of `a * b + c` into one fused multiply-add: each
/// operation rounds on its own, as the CPU's Rust code (which never fuses)
/// computes, so a kernel written as the CPU's formula gives its result.
const NO_FMA: &str = "--fmad=false";

/// The options every kernel file is compiled with.
fn options(arch: &str, include: &Path) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        NO_FMA.into(),
        format!("--include-path={}", include.display()),
    ]
}

/// NVRTC's version `(major, minor)` (`nvrtcVersion`), read once; part of
/// every kernel cache key, so a new NVRTC never reuses an old one's images.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    static VERSION: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            if !nvrtc_present() {
                return Err("cannot load libnvrtc".to_string());
            }
            let (mut major, mut minor) = (0, 0);
            // SAFETY: libnvrtc is present (checked above); the call only
            // writes the two integers.
            unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
                .result()
                .map(|()| (major, minor))
                .map_err(|e| format!("nvrtcVersion failed: {e}"))
        })
        .clone()
        .map_err(|reason| Error::DeviceUnavailable {
            device: Device::Cuda(0),
            reason,
        })
}

thread_local! {
    /// NVRTC compilations run on this thread (tests count cache misses
    /// with it; NVRTC runs on the calling thread).
    static NVRTC_RUNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs NVRTC once on `text` (named `file`) and returns the PTX text's
/// bytes (without the trailing NUL) or the CUBIN.
fn run_nvrtc(
    file: &str,
    text: &str,
    arch: &str,
    kind: ImageKind,
    options: &[String],
) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    NVRTC_RUNS.with(|n| n.set(n.get() + 1));
    let fail = |msg: String, log: String| Error::KernelCompile {
        file: file.to_string(),
        arch: arch.to_string(),
        msg,
        log,
    };
    let text = std::ffi::CString::new(text).map_err(|e| fail(e.to_string(), String::new()))?;
    let name = std::ffi::CString::new(file).map_err(|e| fail(e.to_string(), String::new()))?;
    let prog = result::create_program(&text, Some(&name))
        .map_err(|e| fail(e.to_string(), String::new()))?;
    // SAFETY: `prog` was just created and is destroyed once, below; each
    // output buffer has the size NVRTC reported for it.
    let out =
        unsafe {
            match result::compile_program(prog, options) {
                Err(e) => {
                    let log = result::get_program_log(prog)
                        .map(|l| {
                            std::ffi::CStr::from_ptr(l.as_ptr())
                                .to_string_lossy()
                                .into_owned()
                        })
                        .unwrap_or_default();
                    Err(fail(e.to_string(), log))
                }
                Ok(()) => {
                    let mut size = 0usize;
                    let image =
                        match kind {
                            ImageKind::Ptx => sys::nvrtcGetPTXSize(prog, &mut size)
                                .result()
                                .and_then(|()| {
                                    let mut ptx = vec![0u8; size];
                                    sys::nvrtcGetPTX(prog, ptx.as_mut_ptr().cast())
                                        .result()
                                        .map(|()| ptx)
                                }),
                            ImageKind::Cubin => sys::nvrtcGetCUBINSize(prog, &mut size)
                                .result()
                                .and_then(|()| {
                                    let mut cubin = vec![0u8; size];
                                    sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                                        .result()
                                        .map(|()| cubin)
                                }),
                        };
                    image.map_err(|e| fail(e.to_string(), String::new()))
                }
            }
        };
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    let mut image = out?;
    if kind == ImageKind::Ptx {
        // PTX is returned as a C string.
        while image.last() == Some(&0) {
            image.pop();
        }
    }
    Ok(image)
}

/// `source` (named `file`) compiled with the prelude for `arch`, read from
/// the kernel cache in `dir` when an entry for exactly this input is there
/// (see `kernel_cache`), compiled and stored otherwise.
fn compile_in(
    dir: Option<&Path>,
    file: &str,
    source: &str,
    arch: &str,
    kind: ImageKind,
) -> Result<Vec<u8>> {
    let (text, include) = prepare(file, source)?;
    let options = options(arch, &include);
    let (major, minor) = nvrtc_version()?;
    let key = kernel_cache::key(&[
        text.as_bytes(),
        &major.to_le_bytes(),
        &minor.to_le_bytes(),
        arch.as_bytes(),
        kind.extension().as_bytes(),
        options.join("\n").as_bytes(),
    ]);
    // A readable prefix for people looking in the folder; the key decides.
    let readable: String = file
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!(
        "{readable}.{arch}.{}.{}",
        kernel_cache::hex(&key),
        kind.extension()
    );
    kernel_cache::get_or_compile(dir, &name, &key, || {
        run_nvrtc(file, &text, arch, kind, &options)
    })
}

/// PTX bytes as text (NVRTC writes ASCII).
fn ptx_text(file: &str, arch: &str, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| Error::KernelCompile {
        file: file.to_string(),
        arch: arch.to_string(),
        msg: format!("PTX is not UTF-8: {e}"),
        log: String::new(),
    })
}

/// Where compiled kernels are cached on disk for this process (see the
/// module documentation), or `None` when no candidate folder is writable
/// and kernels are compiled without caching.
pub fn kernel_cache_dir() -> Option<&'static Path> {
    kernel_cache::cache_dir()
}

/// Compiles kernel file `file` (a name from [`SOURCES`]) to PTX for the
/// virtual architecture `arch` (e.g. `compute_90`), or reads it from the
/// kernel cache. No GPU is needed.
/// Errors: libnvrtc or the headers missing ([`Error::DeviceUnavailable`]),
/// or a compile error ([`Error::KernelCompile`] with NVRTC's log).
pub fn compile(file: &str, arch: &str) -> Result<String> {
    compile_source(file, source_of(file)?, arch)
}

/// Compiles `source` (named `file` in messages) with the prelude in front
/// to PTX for `arch`, as [`compile`] does for the files in `kernels/`.
pub fn compile_source(file: &str, source: &str, arch: &str) -> Result<String> {
    let ptx = compile_in(kernel_cache_dir(), file, source, arch, ImageKind::Ptx)?;
    ptx_text(file, arch, ptx)
}

/// Compiles kernel file `file` to a CUBIN for the real architecture `sm`
/// (e.g. `sm_90`), or reads it from the kernel cache: what GPUs load. No
/// GPU is needed; errors as [`compile`].
pub fn compile_cubin(file: &str, sm: &str) -> Result<Vec<u8>> {
    compile_in(
        kernel_cache_dir(),
        file,
        source_of(file)?,
        sm,
        ImageKind::Cubin,
    )
}

/// Compiled images by (kernel file, architecture).
type ImageCache = HashMap<(&'static str, String), Vec<u8>>;

/// The image of kernel file `file` for `arch` (`compute_XY` for
/// [`ImageKind::Ptx`], `sm_XY` for a CUBIN), kept in memory for the rest of
/// the process after the first call (which reads the disk cache or runs
/// NVRTC).
pub fn image_for(file: &'static str, kind: ImageKind, arch: &str) -> Result<Vec<u8>> {
    static CACHE: OnceLock<Mutex<ImageCache>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (file, arch.to_string());
    if let Some(c) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let image = compile_in(kernel_cache_dir(), file, source_of(file)?, arch, kind)?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, image.clone());
    Ok(image)
}

/// [`image_for`] a CUBIN for the real architecture `sm` (e.g. `sm_90`).
pub fn cubin_for(file: &'static str, sm: &str) -> Result<Vec<u8>> {
    image_for(file, ImageKind::Cubin, sm)
}

/// [`image_for`] PTX for the virtual architecture `compute` (e.g.
/// `compute_80`), as text.
pub fn ptx_for(file: &'static str, compute: &str) -> Result<String> {
    ptx_text(file, compute, image_for(file, ImageKind::Ptx, compute)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether NVRTC and the headers are here; without them these tests
    /// print why and pass, unless `LEANGRAD_REQUIRE_NVRTC=1` (as in CI).
    fn nvrtc_usable(test: &str) -> bool {
        let why = if !nvrtc_present() {
            "libnvrtc not found".to_string()
        } else if let Err(e) = include_dir() {
            e.to_string()
        } else {
            return true;
        };
        let required = std::env::var("LEANGRAD_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        assert!(!required, "LEANGRAD_REQUIRE_NVRTC=1 but {why}");
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("skipped: {why} [{test}]\n").as_bytes(),
        );
        false
    }

    fn runs() -> usize {
        NVRTC_RUNS.with(|n| n.get())
    }

    fn scratch(test: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "leangrad-nvrtc-cache-{test}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_second_compile_reads_the_cache_and_a_corrupt_entry_is_recompiled() {
        if !nvrtc_usable("nvrtc cache") {
            return;
        }
        let dir = scratch("hits");
        let src = source_of("relu_mask.cu").unwrap();
        let compile = |arch, kind| compile_in(Some(&dir), "relu_mask.cu", src, arch, kind);
        let start = runs();
        let cold = compile("compute_80", ImageKind::Ptx).unwrap();
        assert_eq!(runs(), start + 1);
        assert!(std::str::from_utf8(&cold).unwrap().contains(".entry"));
        // The hit is seen by NVRTC's run count, not by timing (a loaded
        // machine made a warm read slower than a cold compile once).
        let warm = compile("compute_80", ImageKind::Ptx).unwrap();
        assert_eq!(runs(), start + 1, "the second compile ran NVRTC");
        assert_eq!(warm, cold);
        assert_eq!(entries(&dir).len(), 1);

        // Another architecture, or a CUBIN, is another entry.
        let ptx86 = compile("compute_86", ImageKind::Ptx).unwrap();
        assert!(std::str::from_utf8(&ptx86)
            .unwrap()
            .contains(".target sm_86"));
        let cubin = compile("sm_80", ImageKind::Cubin).unwrap();
        assert!(cubin.starts_with(b"\x7fELF"));
        assert_eq!(runs(), start + 3);
        let files = entries(&dir);
        assert_eq!(files.len(), 3);

        // A corrupted entry is compiled again (same output) and rewritten.
        let entry = files
            .iter()
            .find(|p| p.to_string_lossy().contains(".compute_80."))
            .unwrap();
        let mut bytes = std::fs::read(entry).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x20;
        std::fs::write(entry, &bytes).unwrap();
        assert_eq!(compile("compute_80", ImageKind::Ptx).unwrap(), cold);
        assert_eq!(runs(), start + 4);
        assert_eq!(compile("compute_80", ImageKind::Ptx).unwrap(), cold);
        assert_eq!(runs(), start + 4, "the rewritten entry is read");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_key_covers_the_source() {
        if !nvrtc_usable("nvrtc cache key") {
            return;
        }
        let dir = scratch("source");
        let a = "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }";
        let b = "extern \"C\" __global__ void k(float* x) { x[0] = 2.0f; }";
        let start = runs();
        let pa = compile_in(Some(&dir), "k.cu", a, "compute_80", ImageKind::Ptx).unwrap();
        let pb = compile_in(Some(&dir), "k.cu", b, "compute_80", ImageKind::Ptx).unwrap();
        assert_ne!(pa, pb);
        assert_eq!(runs(), start + 2);
        assert_eq!(entries(&dir).len(), 2);
        // A compile error is not cached.
        let broken = "extern \"C\" __global__ void k(float* x) { x[0] = nope; }";
        for _ in 0..2 {
            let e = compile_in(Some(&dir), "k.cu", broken, "compute_80", ImageKind::Ptx);
            assert!(matches!(e, Err(Error::KernelCompile { .. })), "{e:?}");
        }
        assert_eq!(runs(), start + 4);
        assert_eq!(entries(&dir).len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
