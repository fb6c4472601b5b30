//! Fuzzing the command line: the built `leangrad` binary run with mutated
//! argument lists (values replaced by numbers that overflow, huge sizes,
//! paths to damaged or huge-header images, folders and devices; options
//! removed, repeated, swapped or added) against small fixtures made here.
//!
//! Each run is under a virtual-memory limit (`ulimit -v`) and a time
//! bound. A run killed by a signal (an abort: an allocation that failed
//! outside the checked allocator, a stack overflow), one that exits 101 (a
//! panic), one past the time bound (a hang) or one that fails without a
//! word on stderr is a failure; any other exit is a typed refusal or a
//! success. Counts per command are printed.
//!
//! `LEANGRAD_FUZZ_ITERS=N` sets the runs per command (CI: the default);
//! `LEANGRAD_FUZZ_SEED=S` shifts the seeds for a deep local run.

mod fuzz_common;

use fuzz_common::{base_seed, iterations, mutated, png_with_size, report, scratch, Rng, Tally};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs per command in CI (each a process: up to a few seconds).
const CI_ITERS: usize = 30;

/// The most one run may take (a loaded 2-core CI machine, a debug-ish
/// build, a small model's step).
const PER_RUN: Duration = Duration::from_secs(90);

/// Each run's address-space limit.
const LIMIT_KIB: u64 = 6 << 20;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// The paths the runs use: good images and folders, and damaged ones.
struct Fixtures {
    data: PathBuf,
    images: PathBuf,
    content: PathBuf,
    style: PathBuf,
    out: PathBuf,
    /// Paths a value may be replaced by.
    hostile: Vec<String>,
    /// Files no run may remove: the inputs.
    inputs: Vec<PathBuf>,
}

fn fixtures() -> Fixtures {
    let root = scratch("cli");
    let png = std::fs::read(fixture("data/rgb_23x31.png")).unwrap();
    let jpg = std::fs::read(fixture("data/rgb_16x24.jpg")).unwrap();
    let data = root.join("data");
    for class in ["a", "b"] {
        std::fs::create_dir_all(data.join(class)).unwrap();
        std::fs::write(data.join(class).join("x.png"), &png).unwrap();
        std::fs::write(data.join(class).join("y.jpg"), &jpg).unwrap();
    }
    let images = root.join("images");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::write(images.join("p.png"), &png).unwrap();
    std::fs::write(images.join("q.jpg"), &jpg).unwrap();
    let content = images.join("p.png");
    let style = images.join("q.jpg");
    // Damaged inputs: a huge-header PNG (1×100000 and 100000×100000), a
    // truncated JPEG, garbage, a folder of only bad images.
    let thin = root.join("thin.png");
    std::fs::write(&thin, png_with_size(&png, 1, 100_000)).unwrap();
    let huge = root.join("huge.png");
    std::fs::write(&huge, png_with_size(&png, 100_000, 100_000)).unwrap();
    let cut = root.join("cut.jpg");
    std::fs::write(&cut, &jpg[..jpg.len() * 2 / 3]).unwrap();
    let garbage = root.join("garbage.bmp");
    std::fs::write(&garbage, mutated(&png, &mut Rng::new(7), &jpg)).unwrap();
    let bad = root.join("bad");
    for (class, file) in [("a", &thin), ("a", &cut), ("b", &garbage)] {
        std::fs::create_dir_all(bad.join(class)).unwrap();
        std::fs::copy(file, bad.join(class).join(file.file_name().unwrap())).unwrap();
    }
    let hostile = [&thin, &huge, &cut, &garbage, &bad, &root]
        .iter()
        .map(|p| p.display().to_string())
        .chain(["/dev/null", "/nonexistent/x", "", "-"].map(String::from))
        .collect();
    let inputs = vec![
        data.join("a").join("x.png"),
        images.join("p.png"),
        images.join("q.jpg"),
        bad.join("b").join("garbage.bmp"),
    ];
    Fixtures {
        data,
        images,
        content,
        style,
        out: root.join("out"),
        hostile,
        inputs,
    }
}

/// The base argument lists: each command on small inputs.
fn base_commands(f: &Fixtures) -> Vec<(&'static str, Vec<String>)> {
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let p = |p: &Path| p.display().to_string();
    vec![
        (
            "demo",
            s(&[
                "demo", "--device", "cpu", "--steps", "3", "--hidden", "8", "--points", "10",
            ]),
        ),
        (
            "memory",
            s(&[
                "memory", "--model", "resnet18", "--batch", "2", "--size", "32",
            ]),
        ),
        (
            "finetune",
            [
                s(&["finetune", "--data"]),
                vec![p(&f.data)],
                s(&[
                    "--batch",
                    "2",
                    "--size",
                    "32",
                    "--workers",
                    "1",
                    "--device",
                    "cpu",
                ]),
                s(&["--out"]),
                vec![p(&f.out.join("ckpt"))],
                s(&["--json"]),
            ]
            .concat(),
        ),
        (
            "adversarial",
            [
                s(&["adversarial", "--images"]),
                vec![p(&f.images)],
                s(&["--out"]),
                vec![p(&f.out.join("adv"))],
                s(&[
                    "--size",
                    "32",
                    "--attack",
                    "fgsm",
                    "--batch",
                    "2",
                    "--classes",
                    "10",
                    "--device",
                    "cpu",
                    "--json",
                ]),
            ]
            .concat(),
        ),
        (
            "style",
            [
                s(&["style", "--content"]),
                vec![p(&f.content)],
                s(&["--style"]),
                vec![p(&f.style)],
                s(&["--out"]),
                vec![p(&f.out.join("style.png"))],
                s(&[
                    "--model", "vgg16", "--size", "16", "--steps", "1", "--device", "cpu", "--json",
                ]),
            ]
            .concat(),
        ),
    ]
}

/// Values that break parsers and size arithmetic.
const VALUES: [&str; 20] = [
    "0",
    "1",
    "-1",
    "2",
    "64",
    "65",
    "5000",
    "50000",
    "1000000000000",
    "18446744073709551615",
    "18446744073709551616",
    "4294967296",
    "nan",
    "inf",
    "-inf",
    "1e308",
    "1e-320",
    "abc",
    "é",
    "--",
];

/// Sizes that parse but ask for much: the memory checks must refuse them.
const SIZES: [&str; 9] = [
    "1",
    "3",
    "64",
    "100",
    "4096",
    "50000",
    "1000000",
    "4294967295",
    "18446744073709551615",
];

/// Options whose value is a path.
const PATHS: [&str; 9] = [
    "--data",
    "--val",
    "--images",
    "--content",
    "--style",
    "--weights",
    "--resume",
    "--out",
    "--timeline",
];

/// Options of every command, to add.
const FLAGS: [&str; 24] = [
    "--workers",
    "--batch",
    "--size",
    "--steps",
    "--epochs",
    "--classes",
    "--hidden",
    "--points",
    "--seq",
    "--lr",
    "--eps",
    "--alpha",
    "--every",
    "--targeted",
    "--top",
    "--weights",
    "--resume",
    "--val",
    "--case",
    "--dtype",
    "--skip-bad-images",
    "--fused",
    "--model",
    "--optimizer",
];

/// Options whose value scales the work done (many steps are a long run,
/// not a hang): their values are drawn from the small or invalid ones.
const WORK: [&str; 6] = [
    "--steps", "--epochs", "--points", "--hidden", "--every", "--top",
];

/// A value for `flag`: an interesting number or word, a hostile path, or
/// a long string.
fn value_for(flag: Option<&str>, f: &Fixtures, rng: &mut Rng) -> String {
    if flag.is_some_and(|fl| WORK.contains(&fl)) {
        return rng
            .pick(&["0", "-1", "1", "nan", "18446744073709551616", "abc", ""])
            .to_string();
    }
    let path_flag = flag.is_some_and(|fl| PATHS.contains(&fl));
    match rng.below(8) {
        _ if path_flag && !rng.one_in(4) => rng.pick(&f.hostile).clone(),
        0 => rng.pick(&f.hostile).clone(),
        1 if rng.one_in(4) => "x".repeat(5000),
        2..=4 => rng.pick(&SIZES).to_string(),
        _ => rng.pick(&VALUES).to_string(),
    }
}

/// One to three mutations of an argument list.
fn mutate_args(args: &[String], f: &Fixtures, rng: &mut Rng) -> Vec<String> {
    let mut a = args.to_vec();
    for _ in 0..1 + rng.below(3) {
        let n = a.len();
        match rng.below(7) {
            // Replace a value (an argument after an option).
            0..=2 if n > 1 => {
                let i = 1 + rng.below(n - 1);
                let flag = a[i - 1].starts_with("--").then(|| a[i - 1].clone());
                a[i] = value_for(flag.as_deref(), f, rng);
            }
            3 if n > 1 => {
                a.remove(1 + rng.below(n - 1));
            }
            4 if n > 1 => {
                let i = 1 + rng.below(n - 1);
                let copy = a[i].clone();
                a.insert(i, copy);
            }
            5 if n > 2 => {
                let (i, j) = (1 + rng.below(n - 1), 1 + rng.below(n - 1));
                a.swap(i, j);
            }
            _ => {
                let flag = rng.pick(&FLAGS).to_string();
                let value = value_for(Some(&flag), f, rng);
                a.push(flag);
                if !rng.one_in(5) {
                    a.push(value);
                }
            }
        }
    }
    a
}

/// How one run ended, or why it failed.
fn run(args: &[String], dir: &Path) -> Result<bool, String> {
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {LIMIT_KIB} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_leangrad"))
        .args(args)
        .env("RAYON_NUM_THREADS", "2")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > PER_RUN {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no exit within {PER_RUN:?} (a hang?)"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let tail: String = stderr
        .chars()
        .rev()
        .take(600)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    use std::os::unix::process::ExitStatusExt;
    if let Some(signal) = status.signal() {
        return Err(format!("killed by signal {signal}: {tail}"));
    }
    match status.code() {
        Some(0) => Ok(true),
        Some(101) => Err(format!("panicked: {tail}")),
        Some(_) if stderr.trim().is_empty() => Err("failed without a message".into()),
        Some(_) => Ok(false),
        None => Err("no exit code".into()),
    }
}

#[test]
fn the_command_line_survives_mutated_arguments() {
    let f = fixtures();
    let n = iterations(CI_ITERS);
    let work = scratch("cli-runs");
    let mut tallies = Vec::new();
    for (name, base) in base_commands(&f) {
        let mut tally = Tally::default();
        // The unmutated command first: it must succeed.
        for i in 0..=n {
            let args = if i == 0 {
                base.clone()
            } else {
                let mut rng = Rng::new(base_seed() ^ (i as u64) ^ (name.len() as u64 * 0x1000));
                mutate_args(&base, &f, &mut rng)
            };
            tally.inputs += 1;
            let start = Instant::now();
            let outcome =
                run(&args, &work).and_then(|ended| match f.inputs.iter().find(|p| !p.is_file()) {
                    Some(gone) => Err(format!("the run removed the input {}", gone.display())),
                    None => Ok(ended),
                });
            match outcome {
                Ok(true) => tally.accepted += 1,
                Ok(false) if i == 0 => tally
                    .failures
                    .push((i, "the unmutated command failed".into())),
                Ok(false) => tally.refused += 1,
                Err(what) => tally
                    .failures
                    .push((i, format!("{what}\n  args: {args:?}"))),
            }
            let took = start.elapsed();
            tally.time(i, took);
            if took > PER_RUN / 4 {
                println!(
                    "fuzz: slow but finished ({:.1} s): {args:?}",
                    took.as_secs_f64()
                );
            }
        }
        tallies.push((name, tally));
    }
    report(&tallies);
}
