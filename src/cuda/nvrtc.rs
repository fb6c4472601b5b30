//! Run-time compilation of `kernels/*.cu` with NVRTC.
//!
//! The sources are embedded in the binary with `include_str!`; each is
//! compiled with [`PRELUDE`] (`kernels/common.cuh`) in front of it, once per
//! process: for a device, to a CUBIN for its compute capability (`sm_XY`;
//! [`compile_cubin`]); for the compile check, to PTX for a virtual
//! architecture (`compute_XY`; [`compile`]). The
//! kernels include `cuda_fp16.h` / `cuda_bf16.h`, which NVRTC does not
//! carry: [`include_dir`] finds CUDA's include folder at run time.

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
    ("loss.cu", include_str!("../../kernels/loss.cu")),
    ("random.cu", include_str!("../../kernels/random.cu")),
    ("reduce.cu", include_str!("../../kernels/reduce.cu")),
    ("softmax.cu", include_str!("../../kernels/softmax.cu")),
    ("attention.cu", include_str!("../../kernels/attention.cu")),
    ("conv.cu", include_str!("../../kernels/conv.cu")),
    ("dropout.cu", include_str!("../../kernels/dropout.cu")),
    ("embedding.cu", include_str!("../../kernels/embedding.cu")),
    ("norm.cu", include_str!("../../kernels/norm.cu")),
    ("optim.cu", include_str!("../../kernels/optim.cu")),
    ("pool.cu", include_str!("../../kernels/pool.cu")),
    ("relu_mask.cu", include_str!("../../kernels/relu_mask.cu")),
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
    Ok((format!("{PRELUDE}\n#line 1 \"{file}\"\n{source}"), include))
}

/// Compiles kernel file `file` (a name from [`SOURCES`]) to PTX for the
/// virtual architecture `arch` (e.g. `compute_90`). No GPU is needed.
/// Errors: libnvrtc or the headers missing ([`Error::DeviceUnavailable`]),
/// or a compile error ([`Error::KernelCompile`] with NVRTC's log).
pub fn compile(file: &str, arch: &str) -> Result<String> {
    compile_source(file, source_of(file)?, arch)
}

/// No contraction of `a * b + c` into one fused multiply-add: each
/// operation rounds on its own, as the CPU's Rust code (which never fuses)
/// computes, so a kernel written as the CPU's formula gives its result.
const NO_FMA: &str = "--fmad=false";

/// Compiles `source` (named `file` in messages) with the prelude in front
/// to PTX for `arch`, as [`compile`] does for the files in `kernels/`.
pub fn compile_source(file: &str, source: &str, arch: &str) -> Result<String> {
    let (text, include) = prepare(file, source)?;
    let opts = cudarc::nvrtc::CompileOptions {
        include_paths: vec![include.display().to_string()],
        options: vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".into(),
            NO_FMA.into(),
        ],
        name: Some(file.to_string()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(text, opts)
        .map_err(|e| compile_error(file, arch, e))?;
    Ok(ptx.to_src())
}

/// Compiles kernel file `file` to a CUBIN for the real architecture `sm`
/// (e.g. `sm_90`): what devices load. Unlike PTX, which a driver older
/// than the NVRTC that wrote it refuses, a CUBIN loads on any driver of
/// the same CUDA major version. No GPU is needed; errors as [`compile`].
pub fn compile_cubin(file: &str, sm: &str) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    let (text, include) = prepare(file, source_of(file)?)?;
    let fail = |msg: String, log: String| Error::KernelCompile {
        file: file.to_string(),
        arch: sm.to_string(),
        msg,
        log,
    };
    let text = std::ffi::CString::new(text).map_err(|e| fail(e.to_string(), String::new()))?;
    let name = std::ffi::CString::new(file).map_err(|e| fail(e.to_string(), String::new()))?;
    let prog = result::create_program(&text, Some(&name))
        .map_err(|e| fail(e.to_string(), String::new()))?;
    let options = [
        format!("--gpu-architecture={sm}"),
        "--std=c++17".to_string(),
        NO_FMA.to_string(),
        format!("--include-path={}", include.display()),
    ];
    // SAFETY: `prog` was just created and is destroyed once, below; the
    // CUBIN buffer has the size NVRTC reported.
    let out = unsafe {
        match result::compile_program(prog, &options) {
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
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .and_then(|()| {
                        let mut cubin = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                            .result()
                            .map(|()| cubin)
                    })
                    .map_err(|e| fail(e.to_string(), String::new()))
            }
        }
    };
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn compile_error(file: &str, arch: &str, e: cudarc::nvrtc::CompileError) -> Error {
    let (msg, log) = match e {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
            (nvrtc.to_string(), log.to_string_lossy().into_owned())
        }
        other => (format!("{other:?}"), String::new()),
    };
    Error::KernelCompile {
        file: file.to_string(),
        arch: arch.to_string(),
        msg,
        log,
    }
}

/// Compiled images by (kernel file, architecture).
type BinaryCache = HashMap<(&'static str, String), Vec<u8>>;

/// [`compile_cubin`] with a per-process cache keyed by (file, sm).
pub fn cubin_for(file: &'static str, sm: &str) -> Result<Vec<u8>> {
    static CACHE: OnceLock<Mutex<BinaryCache>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (file, sm.to_string());
    if let Some(c) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    let cubin = compile_cubin(file, sm)?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, cubin.clone());
    Ok(cubin)
}
