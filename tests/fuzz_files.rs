//! Fuzzing the readers of files: safetensors buffers, checkpoint folders,
//! BERT `config.json` and `tokenizer.json`, and PNG/JPEG/BMP images (with
//! their header sizes set huge), each from small valid inputs made here or
//! committed, mutated by the seeded mutator of `fuzz_common`.
//!
//! Every input must give `Ok` or a typed error: no panic, no abort, no
//! hang (each input has a time bound). The targets run in a child process
//! of this test under a virtual-memory limit (`ulimit -v`), so an
//! allocation the checked allocator did not refuse first kills the child
//! and fails the test. Counts per target are printed.
//!
//! `LEANGRAD_FUZZ_ITERS=N` sets the inputs per target (CI: the default);
//! `LEANGRAD_FUZZ_SEED=S` shifts the seeds for a deep local run.

mod fuzz_common;

use fuzz_common::{
    base_seed, bmp_with_size, iterations, jpeg_with_size, keep_dir, mutated, png_with_size, report,
    run_bounded, scratch, Rng, Tally,
};
use leangrad::data::{
    decode_image, read_image, read_image_with, CenterCrop, ColorMode, Compose, Resize, SampleRng,
};
use leangrad::io::{load_safetensors_bytes, serialize_safetensors, state_dict_of, Checkpoint};
use leangrad::models::{Bert, BertConfig, TextTokenizer};
use leangrad::nn::{Linear, Module};
use leangrad::optim::{Adam, Optimizer};
use leangrad::{DType, Device, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Inputs per target in CI (each takes milliseconds).
const CI_ITERS: usize = 1000;

/// The most one input may take, generous for a loaded CI machine.
const PER_INPUT: Duration = Duration::from_secs(20);

/// The child's address-space limit: far below what a bad size asks for,
/// far above what the readers need.
const CHILD_LIMIT_KIB: u64 = 6 << 20;

/// Set in the child that runs the targets.
const CHILD_ENV: &str = "LEANGRAD_FUZZ_CHILD";

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// A tiny WordPiece tokenizer (a BERT-style `tokenizer.json`).
const TOKENIZER_JSON: &str = r###"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
    {"id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 1, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
  ],
  "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "post_processor": {
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
    "special_tokens": {
      "[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
      "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}
    }
  },
  "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
  "model": {
    "type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
    "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5, "##s": 6, "a": 7, "play": 8, "##ing": 9}
  }
}"###;

/// A tiny BERT `config.json`.
const BERT_CONFIG: &str = r#"{"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2,
 "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 16,
 "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
 "position_embedding_type": "absolute"}"#;

/// JSON leaves that break size arithmetic and parsers.
fn interesting_json(rng: &mut Rng) -> serde_json::Value {
    use serde_json::json;
    rng.pick(&[
        json!(0),
        json!(-1),
        json!(1),
        json!(3),
        json!(2_000_000),
        json!(1_000_000_000),
        json!(u32::MAX),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e308),
        json!(-0.0),
        json!(0.5),
        json!("gelu"),
        json!(""),
        json!(null),
        json!(true),
        json!([]),
        json!({}),
    ])
    .clone()
}

/// One structural mutation of a JSON document: a leaf (number, string,
/// …) replaced by an interesting value, a key removed, or an array
/// emptied.
fn mutate_json(value: &mut serde_json::Value, rng: &mut Rng) {
    use serde_json::Value;
    match value {
        Value::Object(map) if !map.is_empty() => {
            let key = map.keys().nth(rng.below(map.len())).cloned().unwrap();
            match rng.below(6) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    map.insert(key, interesting_json(rng));
                }
                _ => mutate_json(map.get_mut(&key).unwrap(), rng),
            }
        }
        Value::Array(items) if !items.is_empty() => {
            if rng.one_in(8) {
                items.clear();
            } else {
                let i = rng.below(items.len());
                mutate_json(&mut items[i], rng);
            }
        }
        leaf => *leaf = interesting_json(rng),
    }
}

/// A JSON text mutated by structure (most inputs) or by bytes.
fn mutated_json(base: &str, rng: &mut Rng) -> Vec<u8> {
    if rng.one_in(3) {
        return mutated(base.as_bytes(), rng, b"{\"a\": [1, 2]}");
    }
    let mut value: serde_json::Value = serde_json::from_str(base).unwrap();
    for _ in 0..1 + rng.below(3) {
        mutate_json(&mut value, rng);
    }
    value.to_string().into_bytes()
}

/// A small model's weights and a checkpoint folder of it (Adam, one step).
fn small_checkpoint(dir: &Path) {
    let cpu = Device::Cpu;
    let layers = [
        Linear::builder(3, 4).seed(1).build(&cpu).unwrap(),
        Linear::builder(4, 2).seed(2).build(&cpu).unwrap(),
    ];
    let state = state_dict_of(&[("fc0", &layers[0] as &dyn Module), ("fc1", &layers[1])]);
    let params: Vec<Tensor> = layers.iter().flat_map(|l| l.parameters()).collect();
    let mut opt = Optimizer::new(params, Adam::new(0.01)).unwrap();
    let x = Tensor::randn(&[5, 3], DType::F32, cpu, 3).unwrap();
    let y = layers[1].forward(&layers[0].forward(&x).unwrap()).unwrap();
    y.square().unwrap().sum_all().unwrap().backward().unwrap();
    opt.step().unwrap();
    Checkpoint::capture(&state, &opt, None)
        .unwrap()
        .with_progress(1, 5)
        .save(dir)
        .unwrap();
}

/// Mutated safetensors buffers of a few tensors of every common dtype.
fn fuzz_safetensors(n: usize, keep: &Path) -> Tally {
    let tensors: Vec<(String, Tensor)> = [DType::F32, DType::F16, DType::I64, DType::U8]
        .iter()
        .enumerate()
        .map(|(i, &dt)| {
            let t = Tensor::arange(6, dt, Device::Cpu)
                .unwrap()
                .reshape(&[2, 3])
                .unwrap();
            (format!("t{i}"), t)
        })
        .collect();
    let base = serialize_safetensors(&tensors).unwrap();
    let mut tally = Tally::default();
    for i in 0..n {
        let mut rng = Rng::new(base_seed() ^ (i as u64) ^ 0x5AFE);
        let input = mutated(&base, &mut rng, &base);
        let data = input.clone();
        run_bounded(
            &mut tally,
            "safetensors",
            i,
            &input,
            keep,
            PER_INPUT,
            move || load_safetensors_bytes(&data).map(drop),
        );
    }
    tally
}

/// Mutated checkpoint folders: its checkpoint.json by structure or bytes,
/// or one of its safetensors files by bytes.
fn fuzz_checkpoint(n: usize, keep: &Path) -> Tally {
    let root = scratch("checkpoint");
    let good = root.join("good");
    small_checkpoint(&good);
    let files = [
        "checkpoint.json",
        "model.safetensors",
        "optimizer.safetensors",
    ];
    let originals: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(good.join(f)).unwrap())
        .collect();
    let mut tally = Tally::default();
    for i in 0..n {
        let mut rng = Rng::new(base_seed() ^ (i as u64) ^ 0xC4EC);
        let which = rng.below(3);
        let input = if which == 0 {
            mutated_json(std::str::from_utf8(&originals[0]).unwrap(), &mut rng)
        } else {
            mutated(&originals[which], &mut rng, &originals[3 - which])
        };
        let dir = root.join(format!("case{}", i % 4));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (f, bytes) in files.iter().zip(&originals) {
            std::fs::write(dir.join(f), bytes).unwrap();
        }
        std::fs::write(dir.join(files[which]), &input).unwrap();
        let name = format!("checkpoint-{}", files[which]);
        run_bounded(&mut tally, &name, i, &input, keep, PER_INPUT, move || {
            Checkpoint::load(&dir).map(drop)
        });
    }
    tally
}

/// Mutated BERT `config.json`s, read and then given to
/// `Bert::from_pretrained` (whose folder has no weights: a config that
/// passes must still be refused or fail on the missing file, never build
/// a huge model).
fn fuzz_bert_config(n: usize, keep: &Path) -> Tally {
    let root = scratch("bert-config");
    let mut tally = Tally::default();
    for i in 0..n {
        let mut rng = Rng::new(base_seed() ^ (i as u64) ^ 0xBE27);
        let input = mutated_json(BERT_CONFIG, &mut rng);
        let dir = root.join(format!("case{}", i % 4));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), &input).unwrap();
        run_bounded(
            &mut tally,
            "bert-config",
            i,
            &input,
            keep,
            PER_INPUT,
            move || {
                BertConfig::from_json_file(dir.join("config.json"))?;
                // Accepted: the model is then refused or lacks its weights file.
                match Bert::from_pretrained(&dir, DType::F32, Device::Cpu) {
                    Err(_) => Ok::<(), leangrad::Error>(()),
                    Ok(_) => panic!("a BERT was built from a folder without weights"),
                }
            },
        );
    }
    tally
}

/// Mutated `tokenizer.json`s, loaded and used on two sentences.
fn fuzz_tokenizer(n: usize, keep: &Path) -> Tally {
    let root = scratch("tokenizer");
    let mut tally = Tally::default();
    for i in 0..n {
        let mut rng = Rng::new(base_seed() ^ (i as u64) ^ 0x70CE);
        let input = mutated_json(TOKENIZER_JSON, &mut rng);
        let path = root.join(format!("tokenizer{}.json", i % 4));
        std::fs::write(&path, &input).unwrap();
        let max_len = *rng.pick(&[0usize, 1, 2, 3, 8, 512]);
        run_bounded(
            &mut tally,
            "tokenizer",
            i,
            &input,
            keep,
            PER_INPUT,
            move || {
                let t = TextTokenizer::from_file(&path, max_len)?;
                t.encode(&["Hello worlds, playing!", "a"], Device::Cpu)
                    .map(drop)
            },
        );
    }
    tally
}

/// The seed images: the data fixtures and the fuzz seeds.
fn seed_images() -> Vec<Vec<u8>> {
    [
        "data/rgb_5x7.png",
        "data/gray_6x4.png",
        "data/rgba_4x5.png",
        "data/rgb_16x24.jpg",
        "data/rgb_9x11.bmp",
        "fuzz/seeds/progressive.jpg",
        "fuzz/seeds/gray.jpg",
        "fuzz/seeds/restarts.jpg",
        "fuzz/seeds/gray16.png",
        "fuzz/seeds/palette.png",
        "fuzz/seeds/interlaced.png",
        "fuzz/seeds/gray.bmp",
    ]
    .iter()
    .map(|f| std::fs::read(fixture(f)).unwrap())
    .collect()
}

/// An image mutated by bytes, or with its header's size set to a value
/// from the interesting ones (then sometimes by bytes too).
fn mutated_image(seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let base = rng.pick(seeds).clone();
    let other = rng.pick(seeds).clone();
    if rng.one_in(3) {
        let sizes = [
            0u32,
            1,
            2,
            224,
            65_535,
            100_000,
            1 << 20,
            0x7FFF_FFFF,
            u32::MAX,
        ];
        let (w, h) = (*rng.pick(&sizes), *rng.pick(&sizes));
        let resized = match base.first() {
            Some(0x89) => png_with_size(&base, w, h),
            Some(0xFF) => jpeg_with_size(&base, w as u16, h as u16),
            _ => bmp_with_size(&base, w as i32, h as i32),
        };
        if rng.one_in(2) {
            return resized;
        }
        return mutated(&resized, rng, &other);
    }
    mutated(&base, rng, &other)
}

/// Mutated images: decoded from memory, and read from a file through the
/// jobs' evaluation pipeline (resize to a shorter side of 32, centre
/// crop), whose memory is checked from the header first.
fn fuzz_images(n: usize, keep: &Path) -> Tally {
    let root = scratch("images");
    let seeds = seed_images();
    let mut tally = Tally::default();
    for i in 0..n {
        let mut rng = Rng::new(base_seed() ^ (i as u64) ^ 0x1A6E);
        let input = mutated_image(&seeds, &mut rng);
        let path = root.join(format!("image{}", i % 4));
        std::fs::write(&path, &input).unwrap();
        let data = input.clone();
        let mode = *rng.pick(&[ColorMode::Rgb, ColorMode::Rgba, ColorMode::Unchanged]);
        run_bounded(
            &mut tally,
            "images",
            i,
            &input,
            keep,
            PER_INPUT,
            move || {
                let from_memory = decode_image(&data, mode);
                let pipeline = Compose::new()
                    .then(Resize::shorter(32))
                    .then(CenterCrop::square(32));
                let from_file = read_image_with(&path, mode, &pipeline, &mut SampleRng::new(0));
                // Both readers agree on whether the bytes are an image.
                match (from_memory, from_file) {
                    (Ok(_), Ok(_)) | (Err(_), Err(_)) => {}
                    (a, b) => panic!("memory {a:?} vs file {b:?}"),
                }
                read_image(&path).map(drop)
            },
        );
    }
    tally
}

/// Runs every target here (in the child) and reports.
fn run_targets() {
    let n = iterations(CI_ITERS);
    let keep = keep_dir();
    let tallies = [
        ("safetensors", fuzz_safetensors(n, &keep)),
        ("checkpoint", fuzz_checkpoint(n, &keep)),
        ("bert-config", fuzz_bert_config(n, &keep)),
        ("tokenizer", fuzz_tokenizer(n, &keep)),
        ("images", fuzz_images(n, &keep)),
    ];
    report(&tallies);
}

#[test]
fn file_readers_survive_mutated_inputs() {
    if std::env::var_os(CHILD_ENV).is_some() {
        run_targets();
        return;
    }
    // This same test, in a child under the memory limit: an abort (an
    // unchecked allocation failing) or a crash fails it.
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {CHILD_LIMIT_KIB} && exec \"$0\" --exact file_readers_survive_mutated_inputs --nocapture --test-threads 1"
        ))
        .arg(&exe)
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The tallies (the harness may print its "test … " before the first).
    let tallies: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.find("fuzz ").map(|at| &l[at..]))
        .filter(|l| l.contains(" inputs, "))
        .collect();
    for line in &tallies {
        println!("{line}");
    }
    assert!(
        out.status.success(),
        "the fuzz child failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    assert_eq!(tallies.len(), 5, "{stdout}");
}

/// PIL's verdict on cuts of the seed JPEGs and PNG
/// (`python-compare/fuzz_seeds.py`): wherever PIL says the file is
/// truncated, leangrad refuses it too.
#[test]
fn truncated_seeds_are_refused_where_pil_refuses_them() {
    let verdicts: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("fuzz/seeds/pil_truncated.json")).unwrap())
            .unwrap();
    let mut checked = 0;
    for (name, cuts) in verdicts.as_object().unwrap() {
        let bytes = std::fs::read(fixture(&format!("fuzz/seeds/{name}"))).unwrap();
        decode_image(&bytes, ColorMode::Rgb).unwrap();
        for (keep, verdict) in cuts.as_object().unwrap() {
            let keep: usize = keep.parse().unwrap();
            let ours = decode_image(&bytes[..keep], ColorMode::Rgb);
            if verdict != "decodes" {
                assert!(ours.is_err(), "{name} cut at {keep}: PIL says {verdict}");
                checked += 1;
            }
        }
    }
    assert!(checked > 60, "{checked}");
}
