//! Fine-tuning a frozen ResNet-18 on an image folder: the head is replaced
//! to match the folder's classes, everything else is frozen with BatchNorm
//! in evaluation mode, and SGD updates each head parameter inside backward
//! (the fused step: no `.grad` is kept). A checkpoint is written at the end.
//!
//! ```sh
//! cargo run --release --example finetune -- TRAIN_DIR [resnet18.safetensors]
//! cargo run --release --example finetune     # 3 synthetic classes, random backbone
//! ```
//!
//! `TRAIN_DIR` holds one sub-folder of images per class, as torchvision's
//! `ImageFolder` reads it.

mod common;

use leangrad::autograd::no_grad;
use leangrad::data::{
    Compose, DataLoader, ImageFolder, Normalize, RandomHorizontalFlip, RandomResizedCrop,
};
use leangrad::io::{load_safetensors, load_state_dict, state_dict, Checkpoint, LoadOptions};
use leangrad::memory::{Category, Ledger};
use leangrad::models::{Freeze, ReplaceHead, ResNet, ResNetConfig};
use leangrad::nn::Module;
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Optimizer, Sgd};
use leangrad::{DType, Device, Result};
use std::path::PathBuf;

const EPOCHS: u64 = 4;

fn main() -> Result<()> {
    // CPU ops run on a pool this thread is part of.
    leangrad::threads::init(None)?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (data, size) = match args.first() {
        Some(dir) => (PathBuf::from(dir), 224),
        None => {
            println!("no image folder given: 3 synthetic classes of 16 images, 64×64");
            let colours = [
                ("red", [0.8, 0.2, 0.2]),
                ("green", [0.2, 0.7, 0.3]),
                ("blue", [0.2, 0.3, 0.8]),
            ];
            (
                common::image_folder(&common::scratch("finetune"), &colours, 16, 64)?,
                64,
            )
        }
    };
    let device = Device::cuda_if_available(0);
    let ledger = Ledger::new();
    let _counted = ledger.enter();

    let train = ImageFolder::new(&data)?.with_transform(
        Compose::new()
            .then(RandomResizedCrop::new(size))
            .then(RandomHorizontalFlip::default())
            .then(Normalize::imagenet()),
    );
    let classes = train.classes().to_vec();
    let loader = DataLoader::new(train, 16)?
        .shuffle(true)
        .seed(0)
        .workers(2)
        .device(device);

    let mut model = ResNet::new(ResNetConfig::resnet18(1000), DType::F32, device, 0)?;
    match args.get(1) {
        Some(w) => {
            load_state_dict(&model, &load_safetensors(w)?, LoadOptions::default())?;
        }
        None => println!("no weights given: the backbone is randomly initialised"),
    }
    model.freeze(&["*"])?;
    model.set_training(false); // frozen BatchNorm: running statistics, nothing saved
    model.replace_head(classes.len(), 1)?; // `model.fc = nn.Linear(512, classes)`, trainable
    let head: Vec<_> = model
        .parameters()
        .into_iter()
        .filter(|p| p.requires_grad())
        .collect();
    let mut opt = Optimizer::new(head, Sgd::new(0.05).momentum(0.9))?;

    for epoch in 0..EPOCHS {
        let (mut loss_sum, mut right, mut seen, mut batches) = (0.0, 0, 0, 0);
        for batch in loader.epoch(epoch) {
            let batch = batch?;
            let logits = model.forward(&batch.images)?;
            let loss = logits.cross_entropy(&batch.labels, CrossEntropyOptions::default())?;
            opt.backward_step(&loss)?; // backward with the update fused in
            let _g = no_grad();
            let predicted = logits.argmax(1, false)?.to_vec::<i64>()?;
            let labels = batch.labels.to_vec::<i64>()?;
            right += predicted
                .iter()
                .zip(&labels)
                .filter(|(p, l)| p == l)
                .count();
            seen += labels.len();
            loss_sum += loss.to_scalar()?;
            batches += 1;
        }
        println!(
            "epoch {epoch}: loss {:.4}, train accuracy {:.1}%",
            loss_sum / batches as f64,
            100.0 * right as f64 / seen as f64
        );
    }

    let out = PathBuf::from("finetune-checkpoint");
    Checkpoint::capture(&state_dict(&model, ""), &opt, None)?
        .with_progress(EPOCHS - 1, EPOCHS * loader.num_batches() as u64)
        .with_metadata("classes", classes.join(",").as_str())
        .save(&out)?;
    let mib = |b: usize| b as f64 / 1048576.0;
    println!(
        "peak {:.1} MiB on {device}: saved for backward {:.2} MiB, head gradients {:.3} MiB; checkpoint in {}",
        mib(ledger.peak(device)),
        mib(ledger.peak_in(device, Category::Saved)),
        mib(ledger.peak_in(device, Category::ParameterGradient)),
        out.display()
    );
    Ok(())
}
