//! `leangrad memory`: the prediction on the meta device equals the
//! measurement on the CPU (small configuration), and bad arguments are
//! clear errors, never panics.

use serde_json::Value;
use std::process::{Command, Output};

fn leangrad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leangrad"))
        .args(args)
        .output()
        .expect("the leangrad binary runs")
}

/// `leangrad` with `args` (ending in `--json`): its JSON, after checking
/// that it succeeded.
fn json_of(args: &[&str]) -> Value {
    let out = leangrad(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

/// `leangrad memory --json` at batch 2: 32×32 images and 10 classes for
/// image models, unless `extra` says otherwise (text models pass `--seq`).
fn memory_json(model: &str, case: &str, extra: &[&str], device: &str) -> Value {
    let mut args = vec![
        "memory", "--model", model, "--batch", "2", "--case", case, "--device", device, "--json",
    ];
    if !extra.contains(&"--seq") {
        args.extend_from_slice(&["--size", "32", "--classes", "10"]);
    }
    args.extend_from_slice(extra);
    json_of(&args)
}

/// The ledger numbers of one policy, without the device's name.
fn numbers(plan: &Value, policy: &str) -> Value {
    let mut r = plan[policy]["report"].clone();
    r.as_object_mut().expect("report object").remove("device");
    r
}

/// A scratch folder of one test alone (`name` under the target's temp
/// folder), emptied first.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}

/// `leangrad memory` for a small ResNet-18 step: batch 2, 32×32, 10 classes.
const SMALL_RESNET: [&str; 9] = [
    "memory",
    "--model",
    "resnet18",
    "--batch",
    "2",
    "--size",
    "32",
    "--classes",
    "10",
];

#[test]
fn meta_prediction_equals_cpu_measurement() {
    for (model, case, extra) in [
        ("resnet18", "input", &[][..]),
        ("resnet18", "all", &["--optimizer", "adamw", "--fused"][..]),
        ("mobilenet_v2", "surgical-last", &[][..]),
        ("resnet18", "input-bn-eval", &["--dtype", "bf16"][..]),
        ("resnet18", "conv-bn-eval", &[][..]),
        ("mobilenet_v2", "surgical-first", &["--fused"][..]),
        (
            "resnet18",
            "all",
            &["--optimizer", "adamw", "--fused", "--checkpoint"][..],
        ),
    ] {
        let meta = memory_json(model, case, extra, "meta");
        let cpu = memory_json(model, case, extra, "cpu");
        assert_eq!(meta["lean"]["report"]["device"], "meta");
        assert_eq!(cpu["lean"]["report"]["device"], "cpu");
        for policy in ["lean", "pytorch"] {
            let (m, c) = (numbers(&meta, policy), numbers(&cpu, policy));
            assert_eq!(m, c, "{model} {case} {policy}");
            assert!(m["peak_total"].as_u64().unwrap() > 0);
        }
        let saved =
            |p: &Value, policy: &str| p[policy]["report"]["peak"]["saved"].as_u64().unwrap();
        assert!(
            saved(&meta, "lean") < saved(&meta, "pytorch"),
            "{model} {case}"
        );
    }
}

/// The full-size transformers, with short inputs so the CPU step is quick:
/// the meta prediction equals the CPU measurement exactly.
#[test]
fn transformer_meta_prediction_equals_cpu_measurement() {
    for (model, case, extra) in [
        ("vit_b16", "input", &[][..]),
        ("bert_base", "input", &["--seq", "8", "--classes", "3"][..]),
        ("gpt2", "surgical-last", &["--seq", "4"][..]),
        ("gpt2", "surgical-last", &["--seq", "4", "--checkpoint"][..]),
    ] {
        let meta = memory_json(model, case, extra, "meta");
        let cpu = memory_json(model, case, extra, "cpu");
        for policy in ["lean", "pytorch"] {
            let (m, c) = (numbers(&meta, policy), numbers(&cpu, policy));
            assert_eq!(m, c, "{model} {case} {policy}");
            assert!(m["peak_total"].as_u64().unwrap() > 0);
        }
        assert_eq!(meta["spec"]["case"], case);
    }
    let gpt2 = memory_json("gpt2", "all", &["--seq", "4"], "meta");
    assert_eq!(gpt2["spec"]["classes"], 50257);
    assert_eq!(gpt2["spec"]["input"]["tokens"]["seq"], 4);
}

/// On a GPU the CUDA step's ledger equals the meta prediction byte for
/// byte; without one, `--device cuda` is a clear error (printed as skipped;
/// a failure under `LEANGRAD_REQUIRE_CUDA=1`).
#[test]
fn cuda_measurement_equals_meta_prediction_or_is_a_clear_error() {
    let mut args = SMALL_RESNET.to_vec();
    args.extend(["--case", "input", "--device", "cuda", "--json"]);
    let probe = leangrad(&args);
    if !probe.status.success() {
        let stderr = String::from_utf8_lossy(&probe.stderr);
        assert!(stderr.contains("not available"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let required = std::env::var("LEANGRAD_REQUIRE_CUDA").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "LEANGRAD_REQUIRE_CUDA=1 but `leangrad memory --device cuda` failed: {stderr}"
        );
        let line = format!("skipped: no CUDA device [leangrad memory --device cuda]: {stderr}");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        return;
    }
    for (model, case, extra) in [
        ("resnet18", "input", &[][..]),
        ("resnet18", "all", &["--optimizer", "adamw", "--fused"][..]),
        ("mobilenet_v2", "surgical-last", &[][..]),
        ("resnet18", "input-bn-eval", &["--dtype", "bf16"][..]),
        ("bert_base", "input", &["--seq", "8", "--classes", "3"][..]),
        ("gpt2", "surgical-last", &["--seq", "4"][..]),
        (
            "bert_base",
            "all",
            &["--seq", "8", "--classes", "3", "--checkpoint"][..],
        ),
    ] {
        let meta = memory_json(model, case, extra, "meta");
        let cuda = memory_json(model, case, extra, "cuda");
        assert_eq!(cuda["lean"]["report"]["device"], "cuda:0");
        for policy in ["lean", "pytorch"] {
            let (m, c) = (numbers(&meta, policy), numbers(&cuda, policy));
            assert_eq!(m, c, "{model} {case} {policy}");
        }
    }
}

#[test]
fn table_lists_categories_and_layers() {
    let out = leangrad(&[
        "memory", "--model", "resnet18", "--batch", "2", "--size", "32", "--top", "3",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for word in [
        "at the moment of the peak",
        "each category's own peak",
        "parameters",
        "activations",
        "saved for backward",
        "optimizer state",
        "workspace",
        "parameter gradients",
        "input gradients",
        "intermediate gradients",
        "total (the peak)",
        "peak reached in",
        "pytorch",
        "what PyTorch's autograd keeps",
        "difference",
        "layer",
    ] {
        assert!(text.contains(word), "{word} missing in\n{text}");
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    for (args, expect) in [
        (
            &["memory", "--model", "vgg16", "--checkpoint"][..],
            "no per-block checkpointing",
        ),
        (&["memory", "--model", "resnet9000"][..], "resnet18"),
        (
            &["memory", "--model", "resnet18", "--batch", "0"][..],
            "batch",
        ),
        (
            &["memory", "--model", "resnet18", "--batch", "many"][..],
            "batch",
        ),
        (
            &["memory", "--model", "resnet18", "--dtype", "f8"][..],
            "f32",
        ),
        (
            &["memory", "--model", "resnet18", "--case", "some"][..],
            "surgical-last-bn-eval",
        ),
        (
            &["memory", "--model", "resnet18", "--seq", "16"][..],
            "--size",
        ),
        (&["memory", "--model", "gpt2", "--size", "32"][..], "--seq"),
        (
            &["memory", "--model", "bert_base", "--seq", "513"][..],
            "512",
        ),
        (
            &["memory", "--model", "gpt2", "--classes", "10"][..],
            "vocabulary",
        ),
        (
            &["memory", "--model", "vit_b16", "--size", "40"][..],
            "patch",
        ),
        // BERT has no convolutions: nothing would train.
        (
            &[
                "memory",
                "--model",
                "bert_base",
                "--batch",
                "1",
                "--seq",
                "4",
                "--case",
                "conv",
            ][..],
            "trains nothing",
        ),
        (
            &["memory", "--model", "resnet18", "--device", "tpu"][..],
            "meta",
        ),
        (
            &["memory", "--model", "resnet18", "--optimizer", "lion"][..],
            "adamw",
        ),
        (&["memory", "--batch", "2"][..], "--model"),
        // VGG-16 has no normalisation layers: nothing would train.
        (
            &[
                "memory", "--model", "vgg16", "--batch", "1", "--size", "32", "--case", "norm",
            ][..],
            "trains nothing",
        ),
    ] {
        let out = leangrad(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// `--timeline` writes every ledger event of both steps as JSON, whose
/// allocations minus frees replay each event's live bytes and whose
/// largest live value is the report's peak; `--plot` draws a PNG or an SVG
/// (by the extension); any other extension, or a folder that does not
/// exist, is an error naming the file.
#[test]
fn timeline_and_plot_files() {
    let dir = scratch("cli_memory_timeline");
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let mut small = SMALL_RESNET.to_vec();
    small.extend(["--case", "input"]);
    let (json, png, svg) = (path("t.json"), path("t.png"), path("t.svg"));
    let mut args = small.to_vec();
    args.extend(["--json", "--timeline", &json, "--plot", &png]);
    let out = leangrad(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: Value = serde_json::from_slice(&out.stdout).expect("the plan's JSON");
    let timeline: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the timeline")).expect("JSON");
    assert_eq!(timeline["model"], "resnet18");
    for policy in ["lean", "pytorch"] {
        let events = timeline[policy]["events"].as_array().expect("events");
        let mut live = 0i64;
        let mut peak = 0i64;
        for e in events {
            let bytes = e["bytes"].as_i64().expect("bytes");
            match e["kind"].as_str().expect("kind") {
                "alloc" => live += bytes,
                "free" => live -= bytes,
                "move" => assert_ne!(e["from"], e["category"]),
                other => panic!("unknown event kind {other}"),
            }
            assert_eq!(live, e["live"].as_i64().expect("live"), "{policy}: {e}");
            peak = peak.max(live);
        }
        let report = &plan[policy]["report"];
        assert_eq!(
            peak,
            report["peak_total"].as_i64().expect("peak"),
            "{policy}"
        );
        assert_eq!(timeline[policy]["peak_total"], report["peak_total"]);
        assert_eq!(timeline[policy]["at_peak"], report["at_peak"]);
        let phases: Vec<&str> = events.iter().filter_map(|e| e["phase"].as_str()).collect();
        for phase in ["setup", "forward", "backward"] {
            assert!(phases.contains(&phase), "{policy}: no {phase} event");
        }
    }
    let png_bytes = std::fs::read(&png).expect("the PNG");
    assert!(png_bytes.len() > 10_000, "{} bytes", png_bytes.len());
    assert_eq!(&png_bytes[..8], b"\x89PNG\r\n\x1a\n");
    let image = image::load_from_memory(&png_bytes).expect("a readable PNG");
    assert_eq!((image.width(), image.height()), (1800, 760));

    let mut args = small.to_vec();
    args.extend(["--plot", &svg]);
    let out = leangrad(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).expect("the SVG");
    let svg_body = text
        .strip_prefix("<!-- Software: leangrad -->\n")
        .expect("the SVG starts with leangrad's marker");
    assert!(svg_body.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("intermediate gradients") && text.contains("backward"));

    let (gif, missing) = (path("t.gif"), path("no/such/folder/t.png"));
    for bad in [&gif, &missing] {
        let mut args = small.to_vec();
        args.extend(["--plot", bad]);
        let out = leangrad(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}");
        assert!(stderr.contains(bad.as_str()), "{bad}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// The plot's x axis counts the step's events from its first (0 at the
/// left edge of each panel, whatever the setup allocated before), and the
/// layers are marked and named.
#[test]
fn the_plot_counts_the_steps_events_and_names_its_layers() {
    let dir = scratch("cli_memory_plot_axis");
    let svg = dir.join("step.svg");
    let svg_arg = svg.to_string_lossy().into_owned();
    let mut args = SMALL_RESNET.to_vec();
    args.extend(["--case", "input", "--plot", &svg_arg]);
    let out = leangrad(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).expect("the SVG");
    // Each text element: its attributes and its content.
    let texts: Vec<(&str, &str)> = text
        .split("<text ")
        .skip(1)
        .filter_map(|t| {
            let (attrs, rest) = t.split_once('>')?;
            Some((attrs, rest.split("</text>").next()?.trim()))
        })
        .collect();
    // The x axis' tick labels are centred under their ticks (the y
    // axis' are right-aligned); one run of them per panel.
    let x_ticks: Vec<u64> = texts
        .iter()
        .filter(|(attrs, _)| attrs.contains("text-anchor=\"middle\""))
        .filter_map(|(_, t)| t.parse().ok())
        .collect();
    let starts = x_ticks.iter().filter(|&&t| t == 0).count();
    assert_eq!(starts, 2, "each panel's x axis starts at 0: {x_ticks:?}");
    assert_eq!(x_ticks.first(), Some(&0), "{x_ticks:?}");
    assert!(text.contains("from its first"));
    // Every residual block is named, in forward and again in backward, in
    // both panels, written downwards.
    for block in ["layer1.0", "layer2.1", "layer4.1"] {
        let named = texts
            .iter()
            .filter(|(attrs, t)| *t == block && attrs.contains("rotate(90"))
            .count();
        assert_eq!(named, 4, "{block}");
    }
}

/// `--plot` and `--timeline` never overwrite a file leangrad did not
/// write (a user's photo, drawing or notes), and say so naming it before
/// any work; leangrad's own earlier plot and timeline are replaced.
#[test]
fn plot_and_timeline_never_overwrite_a_users_file() {
    let dir = scratch("cli_memory_no_overwrite");
    let run = |extra: &[&str]| {
        let mut args = SMALL_RESNET.to_vec();
        args.extend(extra);
        leangrad(&args)
    };
    // A user's PNG (a real image, no leangrad marker), SVG and JSON.
    let photo = dir.join("photo.png");
    image::RgbImage::from_pixel(4, 4, image::Rgb([9, 8, 7]))
        .save(&photo)
        .expect("a user's PNG");
    let drawing = dir.join("drawing.svg");
    std::fs::write(&drawing, "<svg xmlns=\"http://www.w3.org/2000/svg\"/>\n").expect("svg");
    let notes = dir.join("notes.json");
    std::fs::write(&notes, "{\"mine\": true}\n").expect("json");
    for (option, path) in [
        ("--plot", &photo),
        ("--plot", &drawing),
        ("--timeline", &notes),
    ] {
        let before = std::fs::read(path).expect("the user's file");
        let out = run(&[option, &path.to_string_lossy()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{option} {}: overwritten",
            path.display()
        );
        assert!(
            stderr.contains(&*path.to_string_lossy()) && stderr.contains("did not write"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "refused before any work");
        assert_eq!(std::fs::read(path).expect("still there"), before);
    }
    // leangrad's own outputs are replaced on a second run.
    let (png, svg, json) = (dir.join("m.png"), dir.join("m.svg"), dir.join("m.json"));
    for _ in 0..2 {
        for (option, path) in [("--plot", &png), ("--plot", &svg), ("--timeline", &json)] {
            let out = run(&[option, &path.to_string_lossy()]);
            assert!(
                out.status.success(),
                "{option} {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert!(leangrad::data::is_leangrad_png(&png));
}

/// `--checkpoint`: the step with every block a checkpointed segment keeps
/// less for backward (GPT-2 at 16×1024 with fused AdamW: under a quarter
/// of the step's peak without it), and says so in its spec.
#[test]
fn checkpointed_blocks_lower_the_predicted_peak() {
    let plan = |extra: &[&str]| -> Value {
        let mut args = vec![
            "memory",
            "--model",
            "gpt2",
            "--batch",
            "16",
            "--seq",
            "1024",
            "--case",
            "all",
            "--optimizer",
            "adamw",
            "--fused",
            "--json",
        ];
        args.extend_from_slice(extra);
        json_of(&args)
    };
    let (plain, segments) = (plan(&[]), plan(&["--checkpoint"]));
    assert_eq!(segments["spec"]["checkpoint"], true);
    assert_eq!(plain["spec"]["checkpoint"], false);
    let peak = |p: &Value| p["lean"]["report"]["peak_total"].as_u64().unwrap();
    assert!(
        4 * peak(&segments) < peak(&plain),
        "{} vs {}",
        peak(&segments),
        peak(&plain)
    );
}

/// `--autocast bf16`: predicted on meta as the CPU measures it (both
/// policies), named in the JSON, and for ResNet-50 at batch 64, 224², case
/// all, at most 0.6× the f32 step's lean peak (0.535× measured).
#[test]
fn autocast_is_predicted_as_measured_and_halves_resnet50() {
    let bf16 = ["--autocast", "bf16"];
    let meta = memory_json("resnet18", "all", &bf16, "meta");
    let cpu = memory_json("resnet18", "all", &bf16, "cpu");
    assert_eq!(meta["spec"]["autocast"], "bf16");
    for policy in ["lean", "pytorch"] {
        assert_eq!(numbers(&meta, policy), numbers(&cpu, policy), "{policy}");
    }
    let peak = |extra: &[&str]| -> u64 {
        let mut args = vec![
            "memory", "--model", "resnet50", "--batch", "64", "--case", "all", "--json",
        ];
        args.extend_from_slice(extra);
        let plan = json_of(&args);
        assert_eq!(
            plan["spec"]["autocast"],
            extra.get(1).map_or(Value::Null, |d| (*d).into())
        );
        plan["lean"]["report"]["peak_total"].as_u64().unwrap()
    };
    let (f32_peak, bf16_peak) = (peak(&[]), peak(&bf16));
    assert!(
        (bf16_peak as f64) <= 0.6 * f32_peak as f64,
        "{bf16_peak} against {f32_peak}"
    );
}

/// `--world-size`: one rank of data parallel next to one device, the
/// sharded state at most the largest rank's share; combinations that do
/// not apply are refused with the flag named.
#[test]
fn world_size_predicts_one_rank_next_to_one_device() {
    let plan = json_of(&[
        "memory",
        "--model",
        "resnet18",
        "--batch",
        "2",
        "--size",
        "32",
        "--optimizer",
        "adam",
        "--fused",
        "--world-size",
        "4",
        "--shard-optimizer",
        "--json",
    ]);
    assert_eq!(plan["world_size"], 4);
    let state = |row: &str| plan[row]["optimizer_state_bytes"].as_u64().expect(row);
    assert_eq!(state("replicated"), state("single_device"));
    assert!(state("sharded") < state("replicated") / 2, "{plan}");
    let text = leangrad(&[
        "memory",
        "--model",
        "resnet18",
        "--batch",
        "2",
        "--size",
        "32",
        "--world-size",
        "2",
    ]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("one device") && text.contains("rank 0 of 2, replicated state"),
        "{text}"
    );
    for (args, flag) in [
        (&["--shard-optimizer"][..], "--world-size"),
        (
            &["--world-size", "2", "--compare-torch", "meta"][..],
            "--compare-torch",
        ),
        (&["--world-size", "2", "--device", "cpu"][..], "--device"),
    ] {
        let mut all = vec![
            "memory", "--model", "resnet18", "--batch", "2", "--size", "32",
        ];
        all.extend_from_slice(args);
        let out = leangrad(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(flag),
            "{args:?}: {err}"
        );
    }
}

/// ResNet-101, ResNeXt-101 64×4d and AlexNet are `leangrad memory` models:
/// planned on the meta device at full size with torchvision's parameter
/// counts (AlexNet has no buffers: its parameter bytes are exactly 4 per
/// parameter), the lean policy keeping less than PyTorch's; AlexNet's
/// prediction equals the CPU's measurement; what they cannot do is a clear
/// error.
#[test]
fn resnet101_resnext101_and_alexnet_are_planned() {
    for (model, count) in [
        ("resnet101", 44_549_160u64),
        ("resnext101_64x4d", 83_455_272),
        ("alexnet", 61_100_840),
    ] {
        let plan = json_of(&[
            "memory", "--model", model, "--batch", "2", "--case", "input", "--json",
        ]);
        assert_eq!(plan["model"], model);
        let report = |p: &str| plan[p]["report"]["peak"].clone();
        let params = report("lean")["parameters"].as_u64().unwrap();
        if model == "alexnet" {
            assert_eq!(params, 4 * count, "{model}");
        } else {
            // BatchNorm's running statistics besides the parameters.
            assert!(
                params > 4 * count && params < 4 * count + 4 * count / 50,
                "{model}"
            );
        }
        let saved = |p: &str| report(p)["saved"].as_u64().unwrap();
        assert!(saved("lean") < saved("pytorch"), "{model}");
    }
    for case in ["input-bn-eval", "linear"] {
        let args = [
            "memory",
            "--model",
            "alexnet",
            "--batch",
            "2",
            "--size",
            "64",
            "--classes",
            "10",
            "--case",
            case,
            "--json",
            "--device",
        ];
        let meta = json_of(&[&args[..], &["meta"]].concat());
        let cpu = json_of(&[&args[..], &["cpu"]].concat());
        for policy in ["lean", "pytorch"] {
            assert_eq!(
                numbers(&meta, policy),
                numbers(&cpu, policy),
                "alexnet {case} {policy}"
            );
        }
    }
    for (args, expect) in [
        (
            &["memory", "--model", "alexnet", "--checkpoint"][..],
            "no per-block checkpointing",
        ),
        (
            &[
                "memory", "--model", "alexnet", "--batch", "1", "--case", "norm",
            ][..],
            "trains nothing",
        ),
        (
            &["memory", "--model", "alexnet", "--size", "32"][..],
            "pool",
        ),
    ] {
        let out = leangrad(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// RoBERTa- and XLM-RoBERTa-base are `leangrad memory` models: Hugging
/// Face's parameter counts (`RobertaModel` 124,645,632 and
/// `XLMRobertaModel` 278,043,648, plus a 768 × 3 classifier), sequences up
/// to 512 tokens (their 514 positions start after the padding token), the
/// lean policy keeping less than PyTorch's.
#[test]
fn roberta_and_xlm_roberta_are_planned() {
    for (model, count) in [
        ("roberta_base", 124_645_632u64),
        ("xlm_roberta_base", 278_043_648),
    ] {
        let plan = json_of(&[
            "memory",
            "--model",
            model,
            "--batch",
            "2",
            "--seq",
            "16",
            "--classes",
            "3",
            "--case",
            "all",
            "--json",
        ]);
        assert_eq!(plan["model"], model);
        let report = |p: &str| plan[p]["report"]["peak"].clone();
        let params = report("lean")["parameters"].as_u64().unwrap();
        assert_eq!(params, 4 * (count + 768 * 3 + 3), "{model}");
        let saved = |p: &str| report(p)["saved"].as_u64().unwrap();
        assert!(saved("lean") < saved("pytorch"), "{model}");
    }
    let out = leangrad(&["memory", "--model", "roberta_base", "--seq", "513"]);
    assert!(!out.status.success());
}

/// Mistral-7B is a `leangrad memory` model on the meta device: Hugging
/// Face's parameter count (`MistralForCausalLM`, 7,241,732,096) in bf16,
/// a next-token step whose lean policy keeps less than PyTorch's, and
/// sequences longer than its 4096-token sliding window planned with the
/// window's mask.
#[test]
fn mistral_7b_is_planned() {
    let plan = |seq: &str| {
        json_of(&[
            "memory",
            "--model",
            "mistral_7b",
            "--batch",
            "1",
            "--seq",
            seq,
            "--dtype",
            "bf16",
            "--case",
            "all",
            "--json",
        ])
    };
    let p = plan("64");
    assert_eq!(p["model"], "mistral_7b");
    let report = |p: &serde_json::Value, policy: &str| p[policy]["report"]["peak"].clone();
    let params = report(&p, "lean")["parameters"].as_u64().unwrap();
    assert_eq!(params, 2 * 7_241_732_096);
    let saved = |p: &serde_json::Value, policy: &str| report(p, policy)["saved"].as_u64().unwrap();
    assert!(saved(&p, "lean") < saved(&p, "pytorch"));
    // Past the window: the U8 mask `[1, 1, L, L]` is kept by each layer's
    // attention (one storage shared by all 32).
    let long = plan("4100");
    assert!(saved(&long, "lean") > saved(&p, "lean"));
    let out = leangrad(&["memory", "--model", "mistral_7b", "--seq", "32769"]);
    assert!(!out.status.success());
}
