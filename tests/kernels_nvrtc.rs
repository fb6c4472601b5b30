//! Compiles every kernel file (`kernels/*.cu` and the `.cu` files beside their launch code in `src/`) with NVRTC for the architectures we support
//! (PTX for compute_80 and compute_90, and the CUBIN for sm_90 that a device
//! loads, which also runs the assembler), and loads every file's compute_80
//! PTX in the simulated GPU's PTX interpreter (`gpusim/`), so a kernel using
//! an instruction the simulator does not know fails here. Needs libnvrtc and
//! CUDA's headers, not a GPU.
//! Without libnvrtc it prints "skipped: …" — unless LEANGRAD_REQUIRE_NVRTC=1,
//! as in CI, where that is a failure.

use leangrad::cuda::nvrtc;
use leangrad_gpusim::memory::DeviceMemory;
use std::path::PathBuf;
use std::time::Instant;

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
    let root = manifest_dir();
    if !root.join("kernels").is_dir() {
        report!(
            "skipped: {} not found (binary run outside the repository)",
            root.join("kernels").display()
        );
        return;
    }
    // Kernel files live in kernels/ (shared ones) and beside the Rust code
    // that launches them (src/<family>/<file>.cu).
    let mut on_disk: Vec<String> = Vec::new();
    let mut folders = vec![root.join("kernels"), root.join("src")];
    while let Some(d) = folders.pop() {
        for p in std::fs::read_dir(&d).unwrap().flatten().map(|e| e.path()) {
            if p.is_dir() {
                folders.push(p);
            } else if p.extension().is_some_and(|e| e == "cu") {
                on_disk.push(p.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
    }
    on_disk.sort();
    let mut embedded: Vec<String> = nvrtc::SOURCES.iter().map(|s| s.0.to_string()).collect();
    embedded.sort();
    assert_eq!(
        on_disk, embedded,
        "src/cuda/nvrtc.rs SOURCES must list every .cu file (kernels/ and src/), names unique"
    );
}

/// Whether NVRTC and CUDA's headers can be used; otherwise prints why the
/// test `test` is skipped — or fails under LEANGRAD_REQUIRE_NVRTC=1.
fn nvrtc_ready(test: &str) -> bool {
    let required = std::env::var("LEANGRAD_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if !nvrtc::nvrtc_present() {
        assert!(
            !required,
            "LEANGRAD_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded (set LD_LIBRARY_PATH)"
        );
        report!("skipped: libnvrtc not found (set LD_LIBRARY_PATH, or LEANGRAD_REQUIRE_NVRTC=1 to fail) [{test}]");
        return false;
    }
    if let Err(e) = nvrtc::include_dir() {
        assert!(!required, "LEANGRAD_REQUIRE_NVRTC=1 but: {e}");
        report!("skipped: {e} [{test}]");
        return false;
    }
    true
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    if !nvrtc_ready("compile") {
        return;
    }
    let mut failures = Vec::new();
    let mut times = Vec::new();
    for arch in ARCHS {
        let start = Instant::now();
        for (file, _) in nvrtc::SOURCES {
            match nvrtc::compile(file, arch) {
                Ok(ptx) => assert!(
                    ptx.contains(".entry"),
                    "{file} for {arch}: PTX without kernels"
                ),
                Err(e) => failures.push(e.to_string()),
            }
        }
        times.push(format!("{arch} {:.1} s", start.elapsed().as_secs_f64()));
    }
    let start = Instant::now();
    for (file, _) in nvrtc::SOURCES {
        match nvrtc::compile_cubin(file, "sm_90") {
            Ok(cubin) => assert!(
                cubin.starts_with(b"\x7fELF"),
                "{file}: CUBIN is not an ELF image"
            ),
            Err(e) => failures.push(e.to_string()),
        }
    }
    times.push(format!("sm_90 {:.1} s", start.elapsed().as_secs_f64()));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The times show whether the kernel cache was warm (well under a
    // second per architecture) or NVRTC ran.
    report!(
        "compiled {} kernel files: {} (kernel cache: {})",
        nvrtc::SOURCES.len(),
        times.join(", "),
        nvrtc::kernel_cache_dir().map_or("none".into(), |d| d.display().to_string())
    );
}

/// The simulated GPU is given each file's PTX for compute_80 (its default
/// compute capability, 8.0). Its interpreter validates every instruction
/// when a module loads, so an opcode or directive it does not implement
/// fails CI here — with the file, the PTX line and the opcode — rather
/// than a user's run under the simulator.
#[test]
fn every_kernels_ptx_loads_in_the_simulator() {
    if !nvrtc_ready("simulator load") {
        return;
    }
    let mut failures = Vec::new();
    for (file, _) in nvrtc::SOURCES {
        let ptx = match nvrtc::compile(file, "compute_80") {
            Ok(ptx) => ptx,
            Err(e) => {
                failures.push(format!("{file}: does not compile: {e}"));
                continue;
            }
        };
        // A fresh 1 GiB device per file: loading may place module-level
        // data in device memory; nothing else is allocated.
        let mut mem = DeviceMemory::new(1 << 30);
        if let Err(e) = leangrad_gpusim::ptx::Module::load(&ptx, &mut mem) {
            failures.push(format!("{file} (compute_80): {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "PTX the simulated GPU cannot load:\n{}",
        failures.join("\n")
    );
    report!(
        "loaded the compute_80 PTX of {} kernel files in the simulated GPU",
        nvrtc::SOURCES.len()
    );
}

#[test]
fn a_compile_error_is_typed_and_carries_the_log() {
    if !nvrtc_ready("compile error") {
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
