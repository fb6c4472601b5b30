//! Compiles every `kernels/*.cu` with NVRTC for the architectures we support
//! (PTX for compute_80 and compute_90, and the CUBIN for sm_90 that a device
//! loads, which also runs the assembler). Needs libnvrtc and CUDA's headers,
//! not a GPU.
//! Without libnvrtc it prints "skipped: …" — unless LEANGRAD_REQUIRE_NVRTC=1,
//! as in CI, where that is a failure.

use leangrad::cuda::nvrtc;
use std::path::PathBuf;

const ARCHS: [&str; 2] = ["compute_80", "compute_90"];

fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Prints past libtest's output capture (to the process's stderr), so a
/// skipped or passing compile check says so in every run.
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

#[test]
fn every_kernel_file_is_embedded() {
    let dir = manifest_dir().join("kernels");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        report!(
            "skipped: {} not found (binary run outside the repository)",
            dir.display()
        );
        return;
    };
    let mut on_disk: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    on_disk.sort();
    let mut embedded: Vec<String> = nvrtc::SOURCES.iter().map(|s| s.0.to_string()).collect();
    embedded.sort();
    assert_eq!(
        on_disk, embedded,
        "src/cuda/nvrtc.rs SOURCES must list every kernels/*.cu"
    );
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    let required = std::env::var("LEANGRAD_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if !nvrtc::nvrtc_present() {
        assert!(
            !required,
            "LEANGRAD_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded (set LD_LIBRARY_PATH)"
        );
        report!("skipped: libnvrtc not found (set LD_LIBRARY_PATH, or LEANGRAD_REQUIRE_NVRTC=1 to fail)");
        return;
    }
    if let Err(e) = nvrtc::include_dir() {
        assert!(!required, "LEANGRAD_REQUIRE_NVRTC=1 but: {e}");
        report!("skipped: {e}");
        return;
    }
    let mut failures = Vec::new();
    for (file, _) in nvrtc::SOURCES {
        for arch in ARCHS {
            match nvrtc::compile(file, arch) {
                Ok(ptx) => assert!(
                    ptx.contains(".entry"),
                    "{file} for {arch}: PTX without kernels"
                ),
                Err(e) => failures.push(e.to_string()),
            }
        }
        match nvrtc::compile_cubin(file, "sm_90") {
            Ok(cubin) => assert!(
                cubin.starts_with(b"\x7fELF"),
                "{file}: CUBIN is not an ELF image"
            ),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    report!(
        "compiled {} kernel files for {} and sm_90",
        nvrtc::SOURCES.len(),
        ARCHS.join(", ")
    );
}

#[test]
fn a_compile_error_is_typed_and_carries_the_log() {
    if !nvrtc::nvrtc_present() || nvrtc::include_dir().is_err() {
        report!("skipped: libnvrtc or the CUDA headers not found");
        return;
    }
    let broken = "extern \"C\" __global__ void broken(float* x) { x[0] = undeclared_name; }";
    match nvrtc::compile_source("broken.cu", broken, "compute_80") {
        Err(leangrad::Error::KernelCompile {
            file, arch, log, ..
        }) => {
            assert_eq!((file.as_str(), arch.as_str()), ("broken.cu", "compute_80"));
            assert!(log.contains("undeclared_name"), "{log}");
        }
        other => panic!("expected KernelCompile, got {other:?}"),
    }
}
