//! Batches from a [`Dataset`], decoded by worker threads ahead of the
//! consumer (PyTorch's `DataLoader` with `num_workers` and `prefetch`).
//!
//! Each epoch's order is a permutation drawn from (seed, epoch) (or, with a
//! [`DistributedSampler`], this rank's shard of the epoch), and each
//! sample's random transforms from (seed, epoch, sample index), so a run is
//! reproducible whatever the number of workers. Workers take whole batches
//! in order, at most `prefetch` batches past the one the consumer last
//! took; batches are handed over in order.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::dataset::Dataset;
use super::random::{permutation, SampleRng};
use super::sampler::DistributedSampler;
use crate::memory::Ledger;
use crate::{Device, Error, Result, Tensor};

/// The most decoding threads a [`DataLoader`] starts: more is
/// [`Error::InvalidArgument`] (at the first batch) rather than thousands of
/// threads that each reserve a stack and decode nothing useful; image
/// decoding stops gaining long before this on any machine.
pub const MAX_WORKERS: usize = 64;

/// One batch: `images` `[N, C, H, W]` and `labels` `[N]` (I64, what
/// `cross_entropy` takes as targets) on the loader's device, and the
/// dataset indices they came from.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The images, stacked along a new first axis.
    pub images: Tensor,
    /// The class indices, I64.
    pub labels: Tensor,
    /// Which samples of the dataset these are, in batch order.
    pub indices: Vec<usize>,
}

/// The files skipped as unreadable, each reported once.
#[derive(Default)]
struct SkipLog {
    files: Mutex<BTreeSet<PathBuf>>,
}

impl SkipLog {
    fn note(&self, path: PathBuf, reason: &str) {
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if !files.contains(&path) {
            eprintln!(
                "warning: skipping unreadable image {}: {reason}",
                path.display()
            );
            files.insert(path);
        }
    }
}

/// Batches from a [`Dataset`]: size, shuffling, the last partial batch,
/// worker threads and the device the batches go to. Iterate one epoch with
/// [`DataLoader::epoch`].
pub struct DataLoader<D> {
    dataset: Arc<D>,
    batch_size: usize,
    shuffle: bool,
    sampler: Option<DistributedSampler>,
    seed: u64,
    drop_last: bool,
    workers: usize,
    prefetch: usize,
    device: Device,
    skip_bad_files: bool,
    skipped: Arc<SkipLog>,
}

impl<D: Dataset + 'static> DataLoader<D> {
    /// A loader of `batch_size` samples per batch, in dataset order, with
    /// two worker threads, four batches of prefetch, on the CPU, keeping the
    /// last partial batch. `batch_size` 0 is [`Error::InvalidArgument`].
    pub fn new(dataset: D, batch_size: usize) -> Result<DataLoader<D>> {
        if batch_size == 0 {
            return Err(Error::InvalidArgument {
                op: "DataLoader::new",
                msg: "batch_size must be at least 1".into(),
            });
        }
        Ok(DataLoader {
            dataset: Arc::new(dataset),
            batch_size,
            shuffle: false,
            sampler: None,
            seed: 0,
            drop_last: false,
            workers: 2,
            prefetch: 4,
            device: Device::Cpu,
            skip_bad_files: false,
            skipped: Arc::default(),
        })
    }

    /// Whether each epoch visits the samples in its own random order.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// Makes each epoch this rank's shard of the dataset (see
    /// [`DistributedSampler`]), batched by this loader's batch size and
    /// drop_last. The sampler's shuffle and seed pick the order; the
    /// loader's seed still picks the random transforms. As in PyTorch, a
    /// sampler excludes the loader's own shuffle: a loader shuffling already
    /// is [`Error::InvalidArgument`] here, and one set to shuffle afterwards
    /// yields that error as each epoch's first item (and the last). A shard
    /// that would be empty for this dataset is an error here too.
    pub fn sampler(mut self, sampler: DistributedSampler) -> Result<Self> {
        sampler.indices(self.dataset.len(), 0)?;
        self.sampler = Some(sampler);
        self.check_sampler()?;
        Ok(self)
    }

    /// The seed of the shuffles and of the random transforms (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether a last batch smaller than `batch_size` is left out.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// The number of decoding threads; 0 decodes on the consumer's thread
    /// when it asks for a batch. More than [`MAX_WORKERS`] is
    /// [`Error::InvalidArgument`], yielded as the epoch's first item.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// How many batches past the one the consumer last took the workers
    /// may prepare (at least 1).
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch = batches.max(1);
        self
    }

    /// The device batches are moved to.
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Whether a sample whose file cannot be read ([`Error::Image`]) is left
    /// out of its batch (with a warning on stderr, once per file) instead
    /// of ending the batch with that error. A batch whose samples were all
    /// skipped is not yielded.
    pub fn skip_bad_files(mut self, skip: bool) -> Self {
        self.skip_bad_files = skip;
        self
    }

    /// The dataset.
    pub fn dataset(&self) -> &D {
        &self.dataset
    }

    /// The files skipped so far (all epochs), sorted.
    pub fn skipped_files(&self) -> Vec<PathBuf> {
        let files = self.skipped.files.lock().unwrap_or_else(|e| e.into_inner());
        files.iter().cloned().collect()
    }

    /// The number of batches in an epoch.
    pub fn num_batches(&self) -> usize {
        let n = match &self.sampler {
            Some(sampler) => sampler.num_samples(self.dataset.len()),
            None => self.dataset.len(),
        };
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// The order in which `epoch` visits the samples: with a sampler, this
    /// rank's shard (empty where [`DataLoader::epoch`] yields an error).
    pub fn order(&self, epoch: u64) -> Vec<usize> {
        self.try_order(epoch).unwrap_or_default()
    }

    /// A sampler together with the loader's own shuffle is an error.
    fn check_sampler(&self) -> Result<()> {
        if self.sampler.is_some() && self.shuffle {
            return Err(Error::InvalidArgument {
                op: "DataLoader::sampler",
                msg: "a sampler and the loader's shuffle exclude each other; \
                      shuffle with DistributedSampler::shuffle instead"
                    .into(),
            });
        }
        Ok(())
    }

    /// [`DataLoader::order`], or why the epoch cannot start.
    fn try_order(&self, epoch: u64) -> Result<Vec<usize>> {
        self.check_sampler()?;
        let n = self.dataset.len();
        Ok(match &self.sampler {
            Some(sampler) => sampler.indices(n, epoch)?,
            None if self.shuffle => permutation(n, self.seed, epoch),
            None => (0..n).collect(),
        })
    }

    /// The batches of `epoch` (numbered from 0; it picks the shuffle and the
    /// random transforms). Workers start at once; dropping the iterator
    /// early stops and joins them. Batch memory is counted in the ledger
    /// current on this thread. Too many workers, a thread the system does
    /// not give, or a sampler together with the loader's shuffle, is an
    /// error as the first item (and the last).
    pub fn epoch(&self, epoch: u64) -> Epoch {
        let (order, failed) = match self.try_order(epoch) {
            Ok(order) => (order, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        let maker = Arc::new(BatchMaker {
            dataset: self.dataset.clone(),
            order,
            batch_size: self.batch_size,
            seed: self.seed,
            epoch,
            skip: self.skip_bad_files.then(|| self.skipped.clone()),
        });
        if let Some(e) = failed {
            let mut epoch = Epoch::start(maker, 0, 0, self.prefetch, self.device);
            epoch.fail(e);
            return epoch;
        }
        Epoch::start(
            maker,
            self.num_batches(),
            self.workers,
            self.prefetch,
            self.device,
        )
    }
}

/// What a worker needs to make batch `b` of one epoch.
struct BatchMaker {
    dataset: Arc<dyn Dataset>,
    order: Vec<usize>,
    batch_size: usize,
    seed: u64,
    epoch: u64,
    skip: Option<Arc<SkipLog>>,
}

impl BatchMaker {
    /// Batch `b` on the CPU, or `None` when every sample in it was skipped.
    fn make(&self, b: usize) -> Result<Option<Batch>> {
        let start = b * self.batch_size;
        let end = start.saturating_add(self.batch_size).min(self.order.len());
        let (mut images, mut labels, mut indices) = (Vec::new(), Vec::new(), Vec::new());
        for &index in &self.order[start..end] {
            let mut rng = SampleRng::for_sample(self.seed, self.epoch, index as u64);
            match (self.dataset.sample(index, &mut rng), &self.skip) {
                (Ok((image, label)), _) => {
                    images.push(image);
                    labels.push(label as i64);
                    indices.push(index);
                }
                (Err(Error::Image { path, reason }), Some(log)) => log.note(path, &reason),
                (Err(e), _) => return Err(e),
            }
        }
        if images.is_empty() {
            return Ok(None);
        }
        let refs: Vec<&Tensor> = images.iter().collect();
        let images = Tensor::stack(&refs, 0).map_err(|e| match e {
            Error::ShapeMismatch { lhs, rhs, .. } => Error::InvalidArgument {
                op: "DataLoader",
                msg: format!(
                    "images of one batch differ in shape ({lhs:?} vs {rhs:?}); \
                     resize or crop them to one size"
                ),
            },
            other => other,
        })?;
        let n = labels.len();
        let labels = Tensor::from_vec(labels, &[n], Device::Cpu)?;
        Ok(Some(Batch {
            images,
            labels,
            indices,
        }))
    }

    /// [`BatchMaker::make`], with a panic in the dataset turned into an
    /// error, so that the consumer never waits for a batch that will not come.
    fn make_caught(&self, b: usize) -> Result<Option<Batch>> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.make(b))).unwrap_or_else(
            |_| {
                Err(Error::InvalidArgument {
                    op: "DataLoader",
                    msg: format!("the dataset panicked while making batch {b}"),
                })
            },
        )
    }
}

/// The workers' shared schedule: the next batch to take, how far the
/// consumer has got, and whether the epoch was dropped.
struct Schedule {
    next_to_take: usize,
    consumed: usize,
    cancelled: bool,
}

struct Shared {
    schedule: Mutex<Schedule>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }
}

type Delivery = (usize, Result<Option<Batch>>);

/// One epoch's batches, in order (an iterator of `Result<Batch>`). Dropping
/// it stops the workers after the batch each is making, and joins them.
pub struct Epoch {
    maker: Arc<BatchMaker>,
    shared: Arc<Shared>,
    receiver: Option<Receiver<Delivery>>,
    arrived: BTreeMap<usize, Result<Option<Batch>>>,
    next: usize,
    total: usize,
    device: Device,
    threads: Vec<JoinHandle<()>>,
    /// Why the epoch could not start (yielded once, then the end).
    failed: Option<Error>,
}

impl Epoch {
    fn start(
        maker: Arc<BatchMaker>,
        total: usize,
        workers: usize,
        prefetch: usize,
        device: Device,
    ) -> Epoch {
        let shared = Arc::new(Shared {
            schedule: Mutex::new(Schedule {
                next_to_take: 0,
                consumed: 0,
                cancelled: false,
            }),
            changed: Condvar::new(),
        });
        let (sender, receiver) = channel();
        let mut epoch = Epoch {
            maker,
            shared,
            receiver: (workers > 0).then_some(receiver),
            arrived: BTreeMap::new(),
            next: 0,
            total,
            device,
            threads: Vec::new(),
            failed: None,
        };
        if workers > MAX_WORKERS {
            epoch.fail(Error::InvalidArgument {
                op: "DataLoader",
                msg: format!("{workers} worker threads asked for; at most {MAX_WORKERS}"),
            });
            return epoch;
        }
        let ledger = Ledger::current();
        for i in 0..workers {
            let (maker, shared, sender) =
                (epoch.maker.clone(), epoch.shared.clone(), sender.clone());
            let ledger = ledger.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("leangrad-loader-{i}"))
                .spawn(move || {
                    let _counted_here = ledger.enter();
                    work(&maker, &shared, &sender, total, prefetch)
                });
            match spawned {
                Ok(handle) => epoch.threads.push(handle),
                Err(e) => {
                    epoch.fail(Error::InvalidArgument {
                        op: "DataLoader",
                        msg: format!("cannot start worker thread {i} of {workers}: {e}"),
                    });
                    break;
                }
            }
        }
        epoch
    }

    /// Stops the workers already started and makes `error` the epoch's
    /// only remaining item.
    fn fail(&mut self, error: Error) {
        self.stop_workers();
        self.failed = Some(error);
    }

    /// Tells the workers to stop after their batch and joins them.
    fn stop_workers(&mut self) {
        self.shared.lock().cancelled = true;
        self.shared.changed.notify_all();
        // Workers blocked on sending see the receiver gone.
        self.receiver = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// The number of batches not yet yielded (an upper bound when bad files
    /// are skipped).
    pub fn remaining(&self) -> usize {
        if self.failed.is_some() {
            1
        } else {
            self.total - self.next
        }
    }

    /// Batch `b` as made by the workers (or here, without workers).
    fn fetch(&mut self, b: usize) -> Result<Option<Batch>> {
        let Some(receiver) = &self.receiver else {
            return self.maker.make_caught(b);
        };
        loop {
            if let Some(result) = self.arrived.remove(&b) {
                return result;
            }
            match receiver.recv() {
                Ok((index, result)) => {
                    self.arrived.insert(index, result);
                }
                Err(_) => {
                    return Err(Error::InvalidArgument {
                        op: "DataLoader",
                        msg: format!("the worker threads stopped before batch {b}"),
                    })
                }
            }
        }
    }
}

/// A worker's loop: take the next batch while it is within `prefetch` of
/// the consumer, make it, send it; stop when all are taken or the epoch is
/// dropped.
fn work(
    maker: &BatchMaker,
    shared: &Shared,
    sender: &Sender<Delivery>,
    total: usize,
    prefetch: usize,
) {
    loop {
        let b = {
            let mut s = shared.lock();
            while !s.cancelled && s.next_to_take < total && s.next_to_take >= s.consumed + prefetch
            {
                s = shared.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.cancelled || s.next_to_take >= total {
                return;
            }
            s.next_to_take += 1;
            s.next_to_take - 1
        };
        if sender.send((b, maker.make_caught(b))).is_err() {
            return;
        }
    }
}

impl Iterator for Epoch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if let Some(e) = self.failed.take() {
            self.next = self.total;
            return Some(Err(e));
        }
        while self.next < self.total {
            let b = self.next;
            self.next += 1;
            {
                let mut s = self.shared.lock();
                s.consumed = self.next;
                self.shared.changed.notify_all();
            }
            match self.fetch(b) {
                Ok(None) => continue,
                Ok(Some(batch)) => {
                    let moved = batch.images.to_device(self.device).and_then(|images| {
                        Ok(Batch {
                            images,
                            labels: batch.labels.to_device(self.device)?,
                            indices: batch.indices,
                        })
                    });
                    return Some(moved);
                }
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        self.stop_workers();
    }
}
