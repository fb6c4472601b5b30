//! `finetune` data parallel on two simulated CUDA devices (ranks as
//! threads, as `leangrad launch` makes them processes): each rank trains
//! on its shard of every epoch with half the batch, and the weights rank 0
//! writes equal those of one device trained with the whole batch, within
//! the bound of a batch mean taken as the average of two half-batch means.
//! The report counts every rank's images, and gives every rank's peak.
mod cuda_common;
mod distributed_common;

use distributed_common::{free_port, have_devices_for_training, one_at_a_time};
use leangrad::data::{write_png, PngDepth};
use leangrad::distributed::InitOptions;
use leangrad::io::load_safetensors;
use leangrad::jobs::finetune::{run, FinetuneOptions, FinetuneReport};
use leangrad::{DType, Device, Tensor};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("leangrad-ddp-ft-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Six 40² images per class, dark or light.
fn folder(root: &Path) -> PathBuf {
    folder_of(root, 6)
}

/// `per_class` 40² images per class, dark or light.
fn folder_of(root: &Path, per_class: usize) -> PathBuf {
    let dir = root.join("train");
    for (c, class) in ["dark", "light"].iter().enumerate() {
        std::fs::create_dir_all(dir.join(class)).unwrap();
        for i in 0..per_class {
            let lo = if c == 0 { 0.0 } else { 0.6 };
            let t = Tensor::rand_range(
                &[3, 40, 40],
                lo,
                lo + 0.4,
                DType::F32,
                Device::Cpu,
                (10 * c + i) as u64,
            )
            .unwrap();
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

fn options(data: &Path, out: PathBuf, batch: usize, device: Device) -> FinetuneOptions {
    FinetuneOptions {
        size: 32,
        batch,
        epochs: 2,
        lr: 0.05,
        workers: 1,
        out: Some(out),
        device,
        ..FinetuneOptions::new("resnet18", data)
    }
}

fn fc(ckpt: &Path) -> Vec<f32> {
    let tensors = load_safetensors(ckpt.join("model.safetensors")).unwrap();
    ["fc.weight", "fc.bias"]
        .iter()
        .flat_map(|name| tensors[*name].to_vec::<f32>().unwrap())
        .collect()
}

#[test]
fn finetune_on_two_ranks_writes_the_weights_of_one_device_with_the_whole_batch() {
    if !have_devices_for_training("ddp_finetune", 2) {
        return;
    }
    let root = tempdir("two-ranks");
    let data = folder(&root);
    let one: FinetuneReport = {
        let _alone = one_at_a_time();
        run(&options(&data, root.join("one"), 4, Device::Cuda(0))).unwrap()
    };
    let reports: Vec<FinetuneReport> = {
        let _alone = one_at_a_time();
        let port = free_port();
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let mut opts = options(&data, root.join("two"), 2, Device::Cuda(rank));
                opts.distributed = Some(
                    InitOptions::new(rank, 2)
                        .master("127.0.0.1", port)
                        .timeout(Duration::from_secs(60)),
                );
                std::thread::spawn(move || run(&opts).unwrap())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    };
    let (a, b) = (fc(&root.join("one")), fc(&root.join("two")));
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    eprintln!("fc after 2 epochs: largest difference {diff:.3e} of {scale:.3e}");
    assert!(diff <= 1e-5 * scale, "{diff} of {scale}");
    // The second epoch moved the head far more than the two runs differ.
    let after_one_epoch = {
        let _alone = one_at_a_time();
        let mut opts = options(&data, root.join("one-epoch"), 4, Device::Cuda(0));
        opts.epochs = 1;
        run(&opts).unwrap();
        fc(&root.join("one-epoch"))
    };
    let moved = a
        .iter()
        .zip(&after_one_epoch)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(moved > 100.0 * diff, "epoch 2 moved the head by {moved}");
    for (r, rep) in reports.iter().enumerate() {
        assert_eq!(rep.world_size, 2);
        assert_eq!(rep.peak_bytes_per_rank.len(), 2);
        assert!(rep.peak_bytes_per_rank.iter().all(|&p| p > 0));
        for (e1, e2) in one.epochs.iter().zip(&rep.epochs) {
            // Every rank's images counted: the same loss and accuracy.
            assert!(
                (e1.train_loss - e2.train_loss).abs() <= 1e-5 * e1.train_loss.abs(),
                "rank {r}"
            );
            assert_eq!(e1.train_accuracy, e2.train_accuracy, "rank {r}");
        }
        assert_eq!(rep.checkpoint.is_some(), r == 0, "rank 0 alone writes");
    }
    // The two ranks' checkpoint resumes on one device.
    let mut resumed = options(&data, root.join("two"), 4, Device::Cuda(0));
    resumed.epochs = 3;
    resumed.resume = Some(root.join("two"));
    let _alone = one_at_a_time();
    let r = run(&resumed).unwrap();
    assert_eq!(r.first_epoch, 2);
    let _ = std::fs::remove_dir_all(&root);
}

/// Every tensor of a checkpoint's model, by name.
fn all_tensors(ckpt: &Path) -> Vec<(String, Vec<f32>)> {
    let mut tensors: Vec<(String, Vec<f32>)> = load_safetensors(ckpt.join("model.safetensors"))
        .unwrap()
        .into_iter()
        .filter(|(_, t)| t.dtype() == DType::F32)
        .map(|(n, t)| (n, t.to_vec::<f32>().unwrap()))
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

/// The largest difference between two checkpoints' tensors, relative to
/// the largest value of `reference` (as the data-parallel tests measure:
/// a tensor of small values, such as a bias after one step, has sums with
/// cancellation whose rounding is large relative to it alone), and the
/// tensor it is in.
fn largest_difference(a: &[(String, Vec<f32>)], reference: &[(String, Vec<f32>)]) -> (f32, String) {
    assert_eq!(a.len(), reference.len());
    let scale = reference
        .iter()
        .flat_map(|(_, v)| v)
        .fold(0f32, |m, v| m.max(v.abs()));
    let mut worst = (0f32, String::new());
    for ((name, x), (other, y)) in a.iter().zip(reference) {
        assert_eq!(name, other);
        let d = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale;
        if d > worst.0 {
            worst = (d, name.clone());
        }
    }
    worst
}

/// Every layer training with BatchNorm in training mode (`all`): two ranks
/// of two images with `sync_batch_norm` write the weights and running
/// statistics of one device with four; without it, each rank's
/// statistics are its own and they do not. One step (four images): with
/// batch statistics over two to four values per channel (ResNet-18's last
/// stage is 1×1 at 32²) a step from random weights is extremely
/// ill-conditioned. Measured with the same model and sizes on simulated
/// devices: scaling the stem's weights by 1 + 1e-7 moves one device's
/// step by 0.25 of the largest weight; synchronised ranks differ from one
/// device by 7.6e-4, per-rank statistics by 160. After three steps
/// rounding alone grows to differences of order 1. The exact checks are
/// `cuda_ddp.rs`'s (a smaller model) and `sync_batch_norm.rs`'s (f64).
#[test]
fn finetune_with_sync_batchnorm_on_two_ranks_trains_as_one_device() {
    if !have_devices_for_training("ddp_finetune_sync_bn", 2) {
        return;
    }
    let root = tempdir("sync-bn");
    let data = folder_of(&root, 2);
    let with = |mut o: FinetuneOptions, sync: bool| {
        (o.case, o.epochs, o.sync_batch_norm) = ("all".into(), 1, sync);
        o
    };
    {
        let _alone = one_at_a_time();
        run(&with(
            options(&data, root.join("one"), 4, Device::Cuda(0)),
            false,
        ))
        .unwrap();
    }
    for (sync, name) in [(true, "synced"), (false, "local")] {
        let _alone = one_at_a_time();
        let port = free_port();
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let mut opts = with(options(&data, root.join(name), 2, Device::Cuda(rank)), sync);
                opts.distributed = Some(
                    InitOptions::new(rank, 2)
                        .master("127.0.0.1", port)
                        .timeout(Duration::from_secs(60)),
                );
                std::thread::spawn(move || run(&opts).unwrap())
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    let one = all_tensors(&root.join("one"));
    let (synced, at) = largest_difference(&all_tensors(&root.join("synced")), &one);
    eprintln!("sync_batch_norm: largest relative difference {synced:.3e} (in {at})");
    assert!(synced <= 5e-3, "{synced:.3e} in {at}");
    let (local, at) = largest_difference(&all_tensors(&root.join("local")), &one);
    eprintln!("per-rank BatchNorm: largest relative difference {local:.3e} (in {at})");
    assert!(local > 1.0, "{local:.3e} in {at}");
    let _ = std::fs::remove_dir_all(&root);
}

/// The command line: `leangrad launch --nproc-per-node 2 -- leangrad
/// finetune …` (two processes, a simulated device each) prints one report,
/// rank 0's, counting both ranks, and rank 0 writes the checkpoint.
#[test]
fn finetune_under_leangrad_launch_reports_once_for_both_ranks() {
    if !have_devices_for_training("ddp_finetune_launch", 2) {
        return;
    }
    let root = tempdir("launch");
    let data = folder(&root);
    let out = root.join("run");
    let leangrad = env!("CARGO_BIN_EXE_leangrad");
    let port = free_port().to_string();
    let output = {
        let _alone = one_at_a_time();
        std::process::Command::new(leangrad)
            .args([
                "launch",
                "--nproc-per-node",
                "2",
                "--master-port",
                &port,
                "--",
                leangrad,
            ])
            .args([
                "finetune", "--model", "resnet18", "--batch", "2", "--size", "32",
            ])
            // BatchNorm in eval mode (the default case): the flag is
            // accepted and changes nothing.
            .args(["--epochs", "1", "--workers", "1", "--sync-batchnorm"])
            .args(["--json", "--data"])
            .arg(&data)
            .arg("--out")
            .arg(&out)
            .env("GPUSIM_DEVICE_COUNT", "2")
            .env("GPUSIM_NCCL_TIMEOUT_MS", "120000")
            .output()
            .unwrap()
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON report");
    assert_eq!(report["world_size"], 2, "{report}");
    assert_eq!(report["device"], "cuda:0", "{report}");
    assert_eq!(
        report["peak_bytes_per_rank"].as_array().map(Vec::len),
        Some(2)
    );
    // 12 images, 2 per rank per step: 3 steps, every image counted once.
    let epoch = &report["epochs"][0];
    assert!(
        epoch["train_loss"].as_f64().is_some_and(f64::is_finite),
        "{report}"
    );
    assert!(out.join("model.safetensors").is_file());
    let _ = std::fs::remove_dir_all(&root);
}
