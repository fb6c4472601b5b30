//! The DataLoader on synthetic datasets: every sample once per epoch,
//! reproducible shuffles, drop_last, random transforms independent of the
//! number of workers, decoding ahead of a slow consumer, and no hang when
//! an epoch is dropped early or the dataset panics.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use leangrad::data::{DataLoader, Dataset, RandomHorizontalFlip, SampleRng, Transform};
use leangrad::ops::CrossEntropyOptions;
use leangrad::{DType, Device, Result, Tensor};

/// Sample `i` is a 1×2×2 image whose pixels are `i, i, i, i + 0.5` (so a
/// horizontal flip is visible), label `i % 3`; optionally flipped at
/// random, slowed down, and recording which threads decoded it.
#[derive(Default)]
struct Numbers {
    n: usize,
    flip: bool,
    delay: Duration,
    made: AtomicUsize,
    threads: Mutex<HashSet<ThreadId>>,
    panic_at: Option<usize>,
}

impl Numbers {
    fn new(n: usize) -> Numbers {
        Numbers {
            n,
            ..Numbers::default()
        }
    }
}

impl Dataset for Numbers {
    fn len(&self) -> usize {
        self.n
    }

    fn sample(&self, index: usize, rng: &mut SampleRng) -> Result<(Tensor, usize)> {
        std::thread::sleep(self.delay);
        if self.panic_at == Some(index) {
            panic!("sample {index} is cursed");
        }
        self.threads
            .lock()
            .unwrap()
            .insert(std::thread::current().id());
        let v = index as f32;
        let image = Tensor::from_vec(vec![v, v, v, v + 0.5], &[1, 2, 2], Device::Cpu)?;
        let image = if self.flip {
            RandomHorizontalFlip::default().apply(&image, rng)?
        } else {
            image
        };
        self.made.fetch_add(1, Ordering::SeqCst);
        Ok((image, index % 3))
    }
}

/// (indices, first pixel of each image, labels) of every batch of an epoch.
type EpochData = Vec<(Vec<usize>, Vec<f32>, Vec<i64>)>;

fn collect<D: Dataset + 'static>(loader: &DataLoader<D>, epoch: u64) -> EpochData {
    loader
        .epoch(epoch)
        .map(|b| {
            let b = b.unwrap();
            let pixels = b.images.to_vec::<f32>().unwrap();
            (b.indices, pixels, b.labels.to_vec::<i64>().unwrap())
        })
        .collect()
}

#[test]
fn every_sample_once_per_epoch_with_its_label() {
    let loader = DataLoader::new(Numbers::new(10), 4)
        .unwrap()
        .shuffle(true)
        .seed(5);
    assert_eq!(loader.num_batches(), 3);
    let batches = collect(&loader, 0);
    assert_eq!(
        batches.iter().map(|b| b.0.len()).collect::<Vec<_>>(),
        [4, 4, 2]
    );
    let mut seen: Vec<usize> = batches.iter().flat_map(|b| b.0.clone()).collect();
    assert_eq!(seen, loader.order(0));
    seen.sort_unstable();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    for (indices, pixels, labels) in &batches {
        for (k, &i) in indices.iter().enumerate() {
            assert_eq!(
                pixels[k * 4..k * 4 + 4],
                [i as f32, i as f32, i as f32, i as f32 + 0.5]
            );
            assert_eq!(labels[k], (i % 3) as i64);
        }
    }
    // Without shuffling: dataset order.
    let plain = DataLoader::new(Numbers::new(10), 4).unwrap();
    let order: Vec<usize> = collect(&plain, 3)
        .iter()
        .flat_map(|b| b.0.clone())
        .collect();
    assert_eq!(order, (0..10).collect::<Vec<_>>());
}

#[test]
fn drop_last_leaves_out_the_partial_batch() {
    let loader = DataLoader::new(Numbers::new(10), 4)
        .unwrap()
        .shuffle(true)
        .drop_last(true);
    assert_eq!(loader.num_batches(), 2);
    let batches = collect(&loader, 1);
    assert_eq!(batches.len(), 2);
    let seen: BTreeSet<usize> = batches.iter().flat_map(|b| b.0.clone()).collect();
    assert_eq!(seen.len(), 8);
    let order = loader.order(1);
    assert_eq!(seen, order[..8].iter().copied().collect());
    // An exact multiple loses nothing.
    let exact = DataLoader::new(Numbers::new(8), 4).unwrap().drop_last(true);
    assert_eq!(collect(&exact, 0).len(), 2);
}

#[test]
fn shuffles_repeat_with_the_seed_and_change_with_the_epoch() {
    let make = |seed, workers| {
        DataLoader::new(
            Numbers {
                flip: true,
                ..Numbers::new(32)
            },
            5,
        )
        .unwrap()
        .shuffle(true)
        .seed(seed)
        .workers(workers)
    };
    let a = collect(&make(11, 2), 0);
    // Same seed and epoch: the same batches, flips included, whatever the
    // number of workers (0 decodes on this thread).
    assert_eq!(a, collect(&make(11, 0), 0));
    assert_eq!(a, collect(&make(11, 3), 0));
    assert_eq!(a, collect(&make(11, 2), 0));
    // Another epoch, or another seed: another order.
    let b = collect(&make(11, 2), 1);
    assert_ne!(
        a.iter().map(|x| &x.0).collect::<Vec<_>>(),
        b.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    let c = collect(&make(12, 2), 0);
    assert_ne!(
        a.iter().map(|x| &x.0).collect::<Vec<_>>(),
        c.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    // The flips are random per sample: some flipped, some not.
    let flipped = a
        .iter()
        .flat_map(|(_, px, _)| px.chunks(4).map(|p| p[3] < p[2]).collect::<Vec<_>>())
        .filter(|&f| f)
        .count();
    assert!((4..28).contains(&flipped), "{flipped} of 32 flipped");
}

#[test]
fn labels_feed_cross_entropy_on_the_chosen_device() {
    let loader = DataLoader::new(Numbers::new(6), 6).unwrap();
    let batch = loader.epoch(0).next().unwrap().unwrap();
    assert_eq!(batch.images.shape(), &[6, 1, 2, 2]);
    assert_eq!(batch.labels.dtype(), DType::I64);
    // Uniform logits over 3 classes: the loss is ln 3 whatever the labels.
    let logits = Tensor::zeros(&[6, 3], DType::F32, Device::Cpu).unwrap();
    let loss = logits
        .cross_entropy(&batch.labels, CrossEntropyOptions::default())
        .unwrap();
    assert!((loss.to_scalar().unwrap() - 3f64.ln()).abs() < 1e-6);
    // Batches go to the loader's device (the meta device here).
    let meta = DataLoader::new(Numbers::new(6), 4)
        .unwrap()
        .device(Device::Meta);
    for batch in meta.epoch(0) {
        let batch = batch.unwrap();
        assert_eq!(batch.images.device(), Device::Meta);
        assert_eq!(batch.labels.device(), Device::Meta);
    }
}

#[test]
fn workers_decode_ahead_of_a_slow_consumer() {
    let dataset = Numbers {
        delay: Duration::from_millis(20),
        ..Numbers::new(12)
    };
    let loader = DataLoader::new(dataset, 1).unwrap().workers(2).prefetch(4);
    let mut epoch = loader.epoch(0);
    let first = epoch.next().unwrap().unwrap();
    assert_eq!(first.indices, [0]);
    // The "training step": meanwhile the workers prepare the next batches,
    // up to 4 ahead of the one being consumed (batches 0..=4).
    std::thread::sleep(Duration::from_millis(400));
    let made = loader.dataset().made.load(Ordering::SeqCst);
    assert!(
        (3..=5).contains(&made),
        "{made} samples made during the step"
    );
    let rest: Vec<usize> = epoch.map(|b| b.unwrap().indices[0]).collect();
    assert_eq!(rest, (1..12).collect::<Vec<_>>());
    let threads = loader.dataset().threads.lock().unwrap().clone();
    assert!(!threads.contains(&std::thread::current().id()));
    assert_eq!(threads.len(), 2, "both workers decoded");
}

#[test]
fn dropping_an_epoch_early_stops_the_workers() {
    let dataset = Numbers {
        delay: Duration::from_millis(10),
        ..Numbers::new(1000)
    };
    let loader = DataLoader::new(dataset, 2).unwrap().workers(3).prefetch(2);
    let started = Instant::now();
    {
        let mut epoch = loader.epoch(0);
        epoch.next().unwrap().unwrap();
    } // dropped here: joins the workers
    {
        let _never_read = loader.epoch(1);
    }
    let made = loader.dataset().made.load(Ordering::SeqCst);
    assert!(started.elapsed() < Duration::from_secs(5));
    // At most the prefetch window was made: epoch 0, batch 0 taken, so
    // batches 0..=2; epoch 1, nothing taken, so batches 0..=1 (2 samples
    // each); nothing more after the drops.
    assert!(made <= (3 + 2) * 2, "{made} samples made");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(loader.dataset().made.load(Ordering::SeqCst), made);
}

#[test]
fn a_panicking_dataset_is_an_error_not_a_hang() {
    for workers in [0, 2] {
        let dataset = Numbers {
            panic_at: Some(5),
            ..Numbers::new(8)
        };
        let loader = DataLoader::new(dataset, 2).unwrap().workers(workers);
        let results: Vec<_> = loader.epoch(0).collect();
        assert_eq!(results.len(), 4);
        let err = results[2].as_ref().unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
        assert!(results[3].is_ok());
    }
    assert!(DataLoader::new(Numbers::new(3), 0).is_err());
}

#[test]
fn an_empty_dataset_has_no_batches() {
    let loader = DataLoader::new(Numbers::new(0), 3).unwrap();
    assert_eq!(loader.num_batches(), 0);
    assert_eq!(loader.epoch(0).count(), 0);
}
