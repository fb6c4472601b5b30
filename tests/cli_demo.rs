//! `leangrad demo`, the README's main command, runs and prints the ledger,
//! on the CPU and (when present) on CUDA, which `--device auto` (the
//! default) picks.
mod cuda_common;

use std::process::Command;

#[test]
fn demo_trains_and_prints_the_ledger() {
    let out = Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args([
            "demo", "--steps", "150", "--points", "60", "--device", "cpu",
        ])
        .output()
        .expect("the leangrad binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("memory ledger on cpu"), "{stdout}");
    for category in [
        "parameters",
        "optimizer state",
        "activations",
        "saved for backward",
        "workspace",
        "parameter gradients",
        "input gradients",
        "intermediate gradients",
        "total",
        "at peak",
        "peak reached in",
    ] {
        assert!(stdout.contains(category), "missing {category}: {stdout}");
    }
    assert!(
        stdout.contains("fc1/matmul"),
        "saved bytes by layer: {stdout}"
    );
    // The peak is named by the phase of the step it was reached in, not
    // by the ledger's first phase (setup: building the layers).
    let at = stdout
        .split("peak reached in ")
        .nth(1)
        .expect("the peak's moment");
    assert!(
        at.starts_with("forward") || at.starts_with("backward"),
        "{stdout}"
    );
    let losses: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.split("loss ").nth(1))
        .map(|v| v.trim().parse().unwrap())
        .collect();
    assert!(losses.len() >= 2);
    assert!(
        losses.last().unwrap() < &(0.7 * losses[0]),
        "the loss must fall: {losses:?}"
    );
}

#[test]
fn demo_json_is_valid_on_every_device() {
    for dev in cuda_common::devices("demo") {
        let name = if dev == leangrad::Device::Cpu {
            "cpu"
        } else {
            "cuda"
        };
        let out = Command::new(env!("CARGO_BIN_EXE_leangrad"))
            .args([
                "demo", "--steps", "3", "--points", "10", "--json", "--device", name,
            ])
            .output()
            .expect("the leangrad binary runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Progress goes to stderr, so that stdout is the JSON alone.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("({dev}, f32")), "{stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("only JSON");
        let report = v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["device"] == dev.to_string())
            .unwrap_or_else(|| panic!("no ledger entry for {dev}: {v}"));
        // 2-64-64-3 MLP with biases, f32.
        let params = (2 * 64 + 64 + 64 * 64 + 64 + 64 * 3 + 3) * 4;
        assert_eq!(report["live"]["parameters"], params, "{dev}");
        assert_eq!(report["live"]["saved"], 0, "{dev}");
        let phase = report["at_peak"]["phase"].as_str().unwrap_or_default();
        assert!(["forward", "backward"].contains(&phase), "{dev}: {v}");
    }
}

#[test]
fn demo_on_cuda_without_a_gpu_is_a_clear_error() {
    if leangrad::Device::cuda_if_available(0) != leangrad::Device::Cpu {
        return; // a GPU is here: the test above ran the demo on it
    }
    let out = Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args(["demo", "--steps", "1", "--device", "cuda"])
        .output()
        .expect("the leangrad binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("not available") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
