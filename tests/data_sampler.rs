//! The DistributedSampler: PyTorch's rules on index lists written out from
//! its algorithm (and checked against `torch.utils.data.distributed.
//! DistributedSampler` with shuffle off), disjoint shards that cover the
//! dataset when shuffled, orders that repeat with (seed, epoch), typed
//! errors for bad arguments, and the DataLoader giving each rank its shard
//! in the same batches whatever the number of workers.

use std::collections::BTreeSet;

use leangrad::data::{DataLoader, Dataset, DistributedSampler, SampleRng};
use leangrad::{Device, Error, Result, Tensor};

/// Sample `i` is a 1×1×1 image holding `i`, label `i % 3`.
struct Numbers(usize);

impl Dataset for Numbers {
    fn len(&self) -> usize {
        self.0
    }

    fn sample(&self, index: usize, _rng: &mut SampleRng) -> Result<(Tensor, usize)> {
        let image = Tensor::from_vec(vec![index as f32], &[1, 1, 1], Device::Cpu)?;
        Ok((image, index % 3))
    }
}

/// Every rank's indices of `epoch`.
fn shards(
    len: usize,
    world: usize,
    make: impl Fn(DistributedSampler) -> DistributedSampler,
    epoch: u64,
) -> Vec<Vec<usize>> {
    (0..world)
        .map(|rank| {
            make(DistributedSampler::new(world, rank).unwrap())
                .indices(len, epoch)
                .unwrap()
        })
        .collect()
}

fn is_invalid_argument<T>(result: Result<T>) -> bool {
    matches!(result, Err(Error::InvalidArgument { .. }))
}

#[test]
fn pytorch_rules_without_shuffle() {
    // (len, replicas, drop_last, every rank's indices), as PyTorch gives them.
    #[rustfmt::skip]
    let cases: &[(usize, usize, bool, &[&[usize]])] = &[
        (10, 3, false, &[&[0, 3, 6, 9], &[1, 4, 7, 0], &[2, 5, 8, 1]]),
        (10, 3, true, &[&[0, 3, 6], &[1, 4, 7], &[2, 5, 8]]),
        (7, 2, false, &[&[0, 2, 4, 6], &[1, 3, 5, 0]]),
        (7, 2, true, &[&[0, 2, 4], &[1, 3, 5]]),
        (12, 4, false, &[&[0, 4, 8], &[1, 5, 9], &[2, 6, 10], &[3, 7, 11]]),
        (12, 4, true, &[&[0, 4, 8], &[1, 5, 9], &[2, 6, 10], &[3, 7, 11]]),
        (4, 3, true, &[&[0], &[1], &[2]]),
        // Padding longer than the dataset repeats the whole order.
        (2, 5, false, &[&[0], &[1], &[0], &[1], &[0]]),
        (3, 5, false, &[&[0], &[1], &[2], &[0], &[1]]),
        (1, 4, false, &[&[0], &[0], &[0], &[0]]),
    ];
    for &(len, world, drop_last, expected) in cases {
        let got = shards(len, world, |s| s.shuffle(false).drop_last(drop_last), 0);
        assert_eq!(
            got, expected,
            "len {len}, {world} replicas, drop_last {drop_last}"
        );
        let sampler = DistributedSampler::new(world, 0)
            .unwrap()
            .drop_last(drop_last);
        assert_eq!(sampler.num_samples(len), expected[0].len());
        assert_eq!(sampler.total_size(len), expected[0].len() * world);
        // Without shuffle the epoch does not matter.
        assert_eq!(
            shards(len, world, |s| s.shuffle(false).drop_last(drop_last), 9),
            got
        );
    }
}

#[test]
fn shuffled_shards_are_disjoint_and_cover_the_dataset() {
    for len in [1, 2, 5, 10, 17, 64, 101] {
        for world in [1, 2, 3, 4, 7, 8] {
            for drop_last in [false, true] {
                let what = format!("len {len}, {world} replicas, drop_last {drop_last}");
                let make = |s: DistributedSampler| s.seed(11).drop_last(drop_last);
                let sampler = make(DistributedSampler::new(world, 0).unwrap());
                if drop_last && len < world {
                    assert!(is_invalid_argument(sampler.indices(len, 0)), "{what}");
                    continue;
                }
                let all = shards(len, world, make, 3);
                let per_rank = sampler.num_samples(len);
                assert!(all.iter().all(|s| s.len() == per_rank), "{what}");
                let flat: Vec<usize> = all.iter().flatten().copied().collect();
                let distinct: BTreeSet<usize> = flat.iter().copied().collect();
                assert!(distinct.iter().all(|&i| i < len), "{what}");
                if drop_last {
                    // No repeats, and less than one round left out.
                    assert_eq!(distinct.len(), flat.len(), "{what}");
                    assert!(len - flat.len() < world, "{what}");
                } else {
                    // Everything, repeated only to fill the last round.
                    assert_eq!(distinct.len(), len, "{what}");
                    assert_eq!(flat.len(), len.div_ceil(world) * world, "{what}");
                    if len >= world {
                        assert!(flat.len() - len < world, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn orders_repeat_with_seed_and_epoch_and_change_with_them() {
    let sampler = DistributedSampler::new(4, 2).unwrap().seed(5);
    let e0 = sampler.indices(100, 0).unwrap();
    assert_eq!(e0, sampler.indices(100, 0).unwrap());
    assert_ne!(e0, sampler.indices(100, 1).unwrap());
    assert_ne!(e0, sampler.seed(6).indices(100, 0).unwrap());
    assert_ne!(e0, (2..100).step_by(4).collect::<Vec<_>>());
    // Ranks interleave one shared permutation: with one replica it is the
    // order a DataLoader shuffling with the same seed visits.
    let whole = DistributedSampler::new(1, 0).unwrap().seed(5);
    let loader = DataLoader::new(Numbers(100), 8)
        .unwrap()
        .shuffle(true)
        .seed(5);
    for epoch in 0..3 {
        let order = whole.indices(100, epoch).unwrap();
        assert_eq!(order, loader.order(epoch));
        let rank2 = sampler.indices(100, epoch).unwrap();
        assert_eq!(
            rank2,
            order[2..].iter().step_by(4).copied().collect::<Vec<_>>()
        );
    }
}

#[test]
fn invalid_arguments_are_errors() {
    assert!(is_invalid_argument(DistributedSampler::new(0, 0)));
    assert!(is_invalid_argument(DistributedSampler::new(3, 3)));
    assert!(is_invalid_argument(DistributedSampler::new(3, 7)));
    let sampler = DistributedSampler::new(3, 0).unwrap();
    // Nothing to give: no samples, or drop_last below one round.
    assert!(is_invalid_argument(sampler.indices(0, 0)));
    assert!(is_invalid_argument(sampler.drop_last(true).indices(0, 0)));
    assert!(is_invalid_argument(sampler.drop_last(true).indices(2, 0)));
    assert_eq!(sampler.drop_last(true).num_samples(2), 0);
    assert_eq!(sampler.indices(2, 0).unwrap().len(), 1);

    // The loader refuses a sampler it cannot use, and its own shuffle.
    let loader = |n| DataLoader::new(Numbers(n), 2).unwrap();
    assert!(is_invalid_argument(loader(0).sampler(sampler)));
    assert!(is_invalid_argument(
        loader(10).shuffle(true).sampler(sampler)
    ));
    let late = loader(10).sampler(sampler).unwrap().shuffle(true);
    assert!(late.order(0).is_empty());
    let mut epoch = late.epoch(0);
    assert!(matches!(
        epoch.next(),
        Some(Err(Error::InvalidArgument { .. }))
    ));
    assert!(epoch.next().is_none());
}

/// (indices, pixels, labels) of every batch of `epoch`.
fn batches(loader: &DataLoader<Numbers>, epoch: u64) -> Vec<(Vec<usize>, Vec<f32>, Vec<i64>)> {
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
fn the_loader_batches_each_ranks_shard_whatever_the_workers() {
    let (len, world, batch) = (23, 3, 3);
    for drop_last in [false, true] {
        for epoch in 0..2 {
            let mut seen = Vec::new();
            for rank in 0..world {
                let sampler = DistributedSampler::new(world, rank).unwrap().seed(4);
                let shard = sampler.indices(len, epoch).unwrap();
                assert_eq!(shard.len(), 8);
                let make = |workers| {
                    DataLoader::new(Numbers(len), batch)
                        .unwrap()
                        .sampler(sampler)
                        .unwrap()
                        .drop_last(drop_last)
                        .seed(99)
                        .workers(workers)
                };
                let loader = make(0);
                assert_eq!(loader.order(epoch), shard);
                assert_eq!(loader.num_batches(), if drop_last { 2 } else { 3 });
                let got = batches(&loader, epoch);
                assert_eq!(got.len(), loader.num_batches());
                let kept = if drop_last { 6 } else { 8 };
                let expected: Vec<&[usize]> = shard[..kept].chunks(batch).collect();
                for ((indices, pixels, labels), want) in got.iter().zip(&expected) {
                    assert_eq!(indices, want);
                    assert_eq!(pixels, &want.iter().map(|&i| i as f32).collect::<Vec<_>>());
                    assert_eq!(
                        labels,
                        &want.iter().map(|&i| (i % 3) as i64).collect::<Vec<_>>()
                    );
                }
                for workers in [1, 3] {
                    assert_eq!(batches(&make(workers), epoch), got, "{workers} workers");
                }
                seen.extend(shard);
            }
            // The shards cover the dataset; 24 - 23 = 1 sample repeated.
            assert_eq!(seen.len(), 24);
            assert_eq!(seen.iter().copied().collect::<BTreeSet<_>>().len(), len);
        }
    }
}
