//! `leangrad memory --compare-torch` without PyTorch (CI has none): the
//! interpreter is a stand-in named by `LEANGRAD_PYTHON`. Without torch
//! the table still prints and stderr has the exact install line; a
//! stand-in printing the script's JSON fills the torch column and the
//! `torch` field with exactly its numbers; a script that fails is an
//! error naming it with its stderr.
#![cfg(unix)]

use leangrad::memory::human_bytes;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `leangrad memory` for a small ResNet-18 step (batch 2, 32×32, 10
/// classes, case `input`) plus `extra`, with `LEANGRAD_PYTHON=python`.
fn memory(python: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "memory",
        "--model",
        "resnet18",
        "--batch",
        "2",
        "--size",
        "32",
        "--classes",
        "10",
        "--case",
        "input",
        "--compare-torch",
    ];
    args.extend_from_slice(extra);
    run(python, &args)
}

fn run(python: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args(args)
        .env("LEANGRAD_PYTHON", python)
        .env_remove("LEANGRAD_TORCH_SCRIPT")
        .output()
        .expect("the leangrad binary runs")
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leangrad-torchcmp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An executable shell script `name` in `dir` with `body`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Exit status 0, leangrad's own table on stdout without a torch column,
/// and `install` on stderr.
fn table_and_hint(out: &Output, install: &str) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with("resnet18: batch 2, 32×32"), "{stdout}");
    assert!(stdout.contains("at the moment of the peak"), "{stdout}");
    assert!(stdout.contains("saved for backward"), "{stdout}");
    assert!(!stdout.contains("\ntorch:"), "no torch legend: {stdout}");
    assert!(
        stderr.contains(&format!("\n    {install}\n")),
        "`{install}` missing in: {stderr}"
    );
    assert!(stderr.contains("LEANGRAD_PYTHON"), "{stderr}");
}

#[test]
fn without_torch_the_table_prints_with_the_install_line() {
    let dir = tempdir("no-torch");
    // No interpreter at all.
    let out = memory(&dir.join("no-such-python"), &[]);
    table_and_hint(&out, "pip install torch torchvision");
    assert!(text(&out.stderr).contains("Install Python 3, then"));

    // An interpreter that fails importing torch, as Python does.
    let no_torch = script(
        &dir,
        "python",
        "echo 'Traceback (most recent call last):' >&2\n\
         echo \"  File \\\"$1\\\", line 60, in <module>\" >&2\n\
         echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n",
    );
    let out = memory(&no_torch, &[]);
    table_and_hint(&out, "pip install torch torchvision");
    assert!(text(&out.stderr).contains("cannot import torch, torchvision"));
    // The text models need transformers instead of torchvision.
    let out = run(
        &no_torch,
        &[
            "memory",
            "--model",
            "bert_base",
            "--batch",
            "1",
            "--seq",
            "4",
            "--compare-torch",
            "--top",
            "0",
        ],
    );
    assert!(out.status.success());
    assert!(text(&out.stdout).starts_with("bert_base: batch 1, 4 tokens"));
    assert!(text(&out.stderr).contains("\n    pip install torch transformers\n"));
    // With --json the report says what is missing, and stdout is JSON only.
    let out = memory(&no_torch, &["--json"]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON only");
    assert_eq!(v["torch"]["install"], "pip install torch torchvision");
    assert_eq!(
        v["torch"]["missing"],
        serde_json::json!(["torch", "torchvision"])
    );
    assert!(v["pytorch"]["report"]["peak"]["saved"].as_u64().unwrap() > 0);

    // The real script under a real Python without site-packages (-S: no
    // torch can be found), when this machine has a python3.
    let real = Command::new("python3")
        .args(["-S", "-c", "print(1)"])
        .output();
    if real.is_ok_and(|o| o.status.success()) {
        let site_less = script(&dir, "python-no-site", "exec python3 -I -S \"$@\"\n");
        let out = memory(&site_less, &[]);
        table_and_hint(&out, "pip install torch torchvision");
        let out = memory(&site_less, &["--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).expect("JSON only");
        assert_eq!(
            v["torch"]["missing"],
            serde_json::json!(["torch", "torchvision"])
        );
    } else {
        eprintln!("skipped the site-less python3 part: no python3 on this machine");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The script's answer for the step of [`memory`], as the stand-in prints it.
const ANSWER: &str = r#"{"model": "resnet18", "source": "torchvision.models.resnet18",
 "versions": {"torch": "9.8.7", "torchvision": "6.5.4", "transformers": null},
 "batch": 2, "size": 32, "seq": null, "classes": 10, "dtype": "f32", "optimizer": "sgd",
 "fused": false, "case": "input", "device": "meta", "attention": null,
 "trainable_parameters": 0, "parameter_bytes": 44765128, "optimizer_state_bytes": null,
 "saved_bytes": 123456789, "saved_storages": 83, "step_peak_bytes": 987654321,
 "step_peak_method": "test", "seconds": 0.5}"#;

/// The cells of the table's row `name` in the section titled `section`.
fn row_cells(table: &str, section: &str, name: &str) -> Vec<String> {
    let start = table.find(section).expect("section");
    let line = table[start..]
        .lines()
        .find(|l| l.trim_start().starts_with(name))
        .expect("row");
    line.trim_start()[name.len()..]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn the_torch_column_shows_the_scripts_numbers() {
    let dir = tempdir("stub");
    // The stand-in records its arguments and the script's first line,
    // then answers with fixed numbers (on one line, as the script does).
    let one_line = ANSWER.replace('\n', "");
    let stub = script(
        &dir,
        "python",
        &format!(
            "echo \"$@\" > '{args}'\nhead -n 1 \"$1\" > '{first}'\ncat <<'EOF'\n{one_line}\nEOF\n",
            args = dir.join("args.txt").display(),
            first = dir.join("first_line.txt").display(),
        ),
    );
    let out = memory(&stub, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let args = std::fs::read_to_string(dir.join("args.txt")).unwrap();
    let script_path = args.split(' ').next().unwrap();
    assert!(
        script_path.ends_with(".py"),
        "the script comes first: {args}"
    );
    assert!(
        args.trim_end().ends_with(
            "--model resnet18 --batch 2 --case input --classes 10 --dtype f32 \
             --optimizer sgd --device meta --size 32"
        ),
        "{args}"
    );
    // The script run is the one in python-compare/ (the binary's copy).
    let repo_script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/python-compare/torch_step_memory.py"
    ))
    .unwrap();
    let first = std::fs::read_to_string(dir.join("first_line.txt")).unwrap();
    assert_eq!(first.trim_end(), repo_script.lines().next().unwrap());

    assert!(
        stdout.contains(
            "torch: measured in PyTorch itself (torch 9.8.7, torchvision 6.5.4, on meta)"
        ),
        "{stdout}"
    );
    let own = "each category's own peak";
    let at = "at the moment of the peak";
    let header = row_cells(&stdout, own, "lean");
    assert_eq!(header, ["pytorch", "torch", "pytorch/lean"]);
    assert_eq!(
        row_cells(&stdout, own, "saved for backward")[2],
        human_bytes(123456789)
    );
    assert_eq!(
        row_cells(&stdout, own, "parameters")[2],
        human_bytes(44765128)
    );
    assert_eq!(row_cells(&stdout, own, "optimizer state")[2], "—");
    assert_eq!(row_cells(&stdout, own, "workspace")[2], "—");
    assert_eq!(
        row_cells(&stdout, at, "total (the peak)")[2],
        human_bytes(987654321)
    );
    assert_eq!(row_cells(&stdout, at, "saved for backward")[2], "—");
    // What the meta device can and cannot measure, said under the table.
    assert!(
        stdout.contains("torch on meta (batch 2): PyTorch's meta device allocates nothing"),
        "{stdout}"
    );
    assert!(stdout.contains("`--compare-torch cpu`"), "{stdout}");
    // Every row of the sections has the four cells.
    assert_eq!(row_cells(&stdout, at, "intermediate gradients").len(), 4);

    let out = memory(&stub, &["--json"]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON only");
    let answer: Value = serde_json::from_str(ANSWER).unwrap();
    assert_eq!(v["torch"], answer);
    assert_eq!(v["torch"]["saved_bytes"], 123456789);
    assert_eq!(v["torch"]["step_peak_bytes"], 987654321);
    assert_eq!(v["model"], "resnet18");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failing_or_mismatched_script_is_an_error_naming_it() {
    let dir = tempdir("fails");
    let crash = script(
        &dir,
        "python",
        "echo 'Traceback (most recent call last):' >&2\n\
         echo 'RuntimeError: out of cheese' >&2\nexit 1\n",
    );
    let out = memory(&crash, &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("python-compare/torch_step_memory.py"),
        "{stderr}"
    );
    assert!(stderr.contains("RuntimeError: out of cheese"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // An answer for another step (batch 3) is not shown as this one's.
    let other = ANSWER
        .replace('\n', "")
        .replace("\"batch\": 2", "\"batch\": 3");
    let wrong = script(
        &dir,
        "python-wrong",
        &format!("cat <<'EOF'\n{other}\nEOF\n"),
    );
    let out = memory(&wrong, &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("measured batch 3, not the 2 asked for"),
        "{stderr}"
    );

    // Output that is not JSON.
    let garbage = script(&dir, "python-garbage", "echo 'hello'\n");
    let out = memory(&garbage, &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("printed no JSON object"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stand-in's answer for a step PyTorch ran on the CPU at batch 2.
fn cpu_answer() -> String {
    ANSWER
        .replace('\n', "")
        .replace("\"device\": \"meta\"", "\"device\": \"cpu\"")
        .replace(
            "\"optimizer_state_bytes\": null",
            "\"optimizer_state_bytes\": 0",
        )
}

#[test]
fn compare_torch_cpu_measures_a_small_batch_beside_leangrads_numbers_for_it() {
    let dir = tempdir("cpu");
    let stub = script(
        &dir,
        "python",
        &format!(
            "echo \"$@\" > '{args}'\ncat <<'EOF'\n{answer}\nEOF\n",
            args = dir.join("args.txt").display(),
            answer = cpu_answer(),
        ),
    );
    let step = |batch: &'static str, extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "memory",
            "--model",
            "resnet18",
            "--batch",
            batch,
            "--size",
            "32",
            "--classes",
            "10",
            "--case",
            "input",
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect()
    };
    let run = |python: &Path, args: &[String]| {
        run(python, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // At --batch 8, PyTorch runs the step on the CPU at batch 2.
    let out = run(&stub, &step("8", &["--compare-torch", "cpu"]));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let args = std::fs::read_to_string(dir.join("args.txt")).unwrap();
    assert!(
        args.trim_end().ends_with(
            "--model resnet18 --batch 2 --case input --classes 10 --dtype f32 \
             --optimizer sgd --device cpu --size 32"
        ),
        "{args}"
    );
    let (own, beside) = stdout
        .split_once("PyTorch ran the step at batch 2 (--torch-batch); beside it, leangrad's prediction for batch 2:")
        .expect("a second table for PyTorch's batch");
    assert!(own.starts_with("resnet18: batch 8, 32×32"), "{stdout}");
    assert!(
        !own.contains("\ntorch:"),
        "no torch column at batch 8: {own}"
    );
    assert!(
        beside.trim_start().starts_with("resnet18: batch 2, 32×32"),
        "{beside}"
    );
    let at = "at the moment of the peak";
    assert_eq!(
        row_cells(beside, at, "total (the peak)")[2],
        human_bytes(987654321)
    );
    assert_eq!(
        row_cells(beside, "each category's own peak", "optimizer state")[2],
        "0 B"
    );
    assert!(
        beside.contains("torch on cpu (batch 2): the step's peak is the bytes of the storages"),
        "{beside}"
    );
    // The numbers beside PyTorch's are leangrad's own for batch 2, exactly.
    let alone = text(&run(&stub, &step("2", &[])).stdout);
    assert_eq!(
        row_cells(beside, at, "total (the peak)")[..2],
        row_cells(&alone, at, "total (the peak)")[..2]
    );
    let out = run(&stub, &step("8", &["--compare-torch", "cpu", "--json"]));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON only");
    assert_eq!(v["spec"]["batch"], 8);
    assert_eq!(v["torch"]["batch"], 2);
    assert_eq!(v["torch_batch_plan"]["spec"]["batch"], 2);
    assert_eq!(v["torch"]["step_peak_bytes"], 987654321);

    // At the same batch the column is in the one table, and the plot
    // draws PyTorch's peak.
    let svg = dir.join("step.svg");
    let out = run(
        &stub,
        &step(
            "2",
            &["--compare-torch", "cpu", "--plot", svg.to_str().unwrap()],
        ),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !stdout.contains("PyTorch ran the step at batch"),
        "{stdout}"
    );
    assert_eq!(
        row_cells(&stdout, at, "total (the peak)")[2],
        human_bytes(987654321)
    );
    let drawn = std::fs::read_to_string(&svg).unwrap();
    let label = format!("PyTorch measured on cpu: peak {}", human_bytes(987654321));
    assert!(drawn.contains(&label), "no `{label}` in the plot");
    // Of another batch, the plot has no such line and says why.
    let out = run(
        &stub,
        &step(
            "8",
            &["--compare-torch", "cpu", "--plot", svg.to_str().unwrap()],
        ),
    );
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("no line for PyTorch's peak: it ran at batch 2"),
        "{}",
        text(&out.stderr)
    );
    assert!(!std::fs::read_to_string(&svg)
        .unwrap()
        .contains("PyTorch measured"));
    let _ = std::fs::remove_dir_all(&dir);
}
