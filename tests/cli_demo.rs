//! `leangrad demo`, the README's main command, runs and prints the ledger.
use std::process::Command;

#[test]
fn demo_trains_and_prints_the_ledger() {
    let out = Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args(["demo", "--steps", "150", "--points", "60"])
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
        "parameter",
        "gradient",
        "saved",
        "optimizer_state",
        "workspace",
        "other",
        "total",
    ] {
        assert!(stdout.contains(category), "missing {category}: {stdout}");
    }
    assert!(
        stdout.contains("fc1/matmul"),
        "saved bytes by layer: {stdout}"
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
fn demo_json_is_valid() {
    let out = Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args(["demo", "--steps", "3", "--points", "10", "--json"])
        .output()
        .expect("the leangrad binary runs");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = &stdout[stdout.find('{').expect("a JSON object")..];
    let v: serde_json::Value = serde_json::from_str(json).expect("valid JSON");
    let cpu = &v["devices"][0];
    assert_eq!(cpu["device"], "cpu");
    // 2-64-64-3 MLP with biases, f32.
    let params = (2 * 64 + 64 + 64 * 64 + 64 + 64 * 3 + 3) * 4;
    assert_eq!(cpu["live"]["parameter"], params);
    assert_eq!(cpu["live"]["saved"], 0);
}
