//! Loading PTX: every file of a corpus directory (NVRTC's output for
//! leangrad's kernels, given by `GPUSIM_PTX_DIR`), the committed fixtures,
//! and load-time rejection of unsupported instructions.

use leangrad_gpusim::memory::DeviceMemory;
use leangrad_gpusim::ptx::Module;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    PathBuf::from(dir).join("tests/fixtures")
}

#[test]
fn corpus_directory_loads() {
    let Ok(dir) = std::env::var("GPUSIM_PTX_DIR") else {
        println!("GPUSIM_PTX_DIR unset: skipping the full-corpus load check");
        return;
    };
    let mut n = 0;
    let mut kernels = 0;
    for e in std::fs::read_dir(&dir).expect("read GPUSIM_PTX_DIR") {
        let p = e.expect("dir entry").path();
        if p.extension().and_then(|x| x.to_str()) != Some("ptx") {
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("read ptx");
        let mut mem = DeviceMemory::new(1 << 30);
        let m = Module::load(&text, &mut mem).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        kernels += m.kernel_names().len();
        m.unload(&mut mem);
        assert_eq!(mem.live_count(), 0);
        n += 1;
    }
    println!("loaded {n} PTX files, {kernels} kernels");
    assert!(n > 0, "no .ptx file in {dir}");
}

#[test]
fn fixtures_load() {
    for e in std::fs::read_dir(fixtures()).expect("fixtures") {
        let p = e.expect("entry").path();
        if p.extension().and_then(|x| x.to_str()) != Some("ptx") {
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("read");
        let mut mem = DeviceMemory::new(1 << 24);
        let m = Module::load(&text, &mut mem).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(!m.kernel_names().is_empty());
    }
}
