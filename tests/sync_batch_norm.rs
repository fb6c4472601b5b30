//! SyncBatchNorm's arithmetic on the CPU: ranks are threads exchanging
//! through an in-memory `BatchStatsSync`, so the statistics, running
//! statistics and gradients can be compared with one batch norm over the
//! concatenated batch exactly as data parallel would see them (the NCCL
//! path is `cuda_ddp.rs`'s, on simulated devices).

use leangrad::models::{ResNet, ResNetConfig};
use leangrad::nn::{BatchNorm, BatchStatsSync, Module};
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Optimizer, Sgd};
use leangrad::{DType, Device, Result, Tensor};
use std::sync::{Arc, Barrier, Mutex};

/// Ranks as threads: each deposits its values, all read every rank's.
struct ThreadExchange {
    world: usize,
    barrier: Barrier,
    slots: Mutex<Vec<Vec<f64>>>,
    /// Collectives run so far, per kind (all_gather, all_reduce), rank 0's.
    calls: Mutex<[usize; 2]>,
}

/// One rank's handle on the exchange.
struct ThreadRank {
    rank: usize,
    exchange: Arc<ThreadExchange>,
}

impl ThreadRank {
    /// Every rank's values of `t`, in rank order.
    fn gather(&self, t: &Tensor, kind: usize) -> Result<Vec<Vec<f64>>> {
        let x = &self.exchange;
        x.slots.lock().unwrap()[self.rank] = t.to_f64_vec()?;
        if self.rank == 0 {
            x.calls.lock().unwrap()[kind] += 1;
        }
        x.barrier.wait();
        let all = x.slots.lock().unwrap().clone();
        // No rank overwrites its slot before every rank has read them.
        x.barrier.wait();
        Ok(all)
    }
}

impl BatchStatsSync for ThreadRank {
    fn world_size(&self) -> usize {
        self.exchange.world
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        let all = self.gather(t, 0)?;
        let flat: Vec<f64> = all.concat();
        Tensor::from_vec(flat, &[self.exchange.world, t.numel()], t.device())?.to_dtype(t.dtype())
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<()> {
        let all = self.gather(t, 1)?;
        let mut sum = vec![0f64; t.numel()];
        for values in &all {
            for (s, v) in sum.iter_mut().zip(values) {
                *s += v;
            }
        }
        let sum = Tensor::from_vec(sum, t.shape(), t.device())?.to_dtype(t.dtype())?;
        t.mul_scalar_(0.0)?;
        t.add_(&sum)
    }
}

fn exchange(world: usize) -> Arc<ThreadExchange> {
    Arc::new(ThreadExchange {
        world,
        barrier: Barrier::new(world),
        slots: Mutex::new(vec![Vec::new(); world]),
        calls: Mutex::new([0, 0]),
    })
}

/// Deterministic values in about [-2, 3): a mean away from zero, so that
/// the variance's combination is tested where cancellation would show.
fn values(n: usize, salt: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 7 + salt * 13) as f64 * 0.61).sin() * 2.5 + 0.5 + (i % 5) as f64 * 0.1)
        .collect()
}

fn bn(c: usize, dtype: DType) -> BatchNorm {
    let m = BatchNorm::builder(c)
        .dtype(dtype)
        .build2d(&Device::Cpu)
        .unwrap();
    // Weights other than ones, so that `scale` matters.
    let w: Vec<f64> = (0..c).map(|i| 0.5 + i as f64 * 0.25).collect();
    let w = Tensor::from_vec(w, &[c], Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let _ng = leangrad::autograd::no_grad();
    m.weight.as_ref().unwrap().mul_scalar_(0.0).unwrap();
    m.weight.as_ref().unwrap().add_(&w).unwrap();
    drop(_ng);
    m
}

/// What one batch norm produced: output, input gradient, weight and bias
/// gradients, running mean and variance, as f64.
#[derive(Debug)]
struct Outcome {
    y: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
    running_mean: Vec<f64>,
    running_var: Vec<f64>,
}

/// Two training steps of `layer` on `x` with the loss `Σ y·c`.
fn train(layer: &BatchNorm, x: &Tensor, c: &Tensor) -> Outcome {
    let mut last = None;
    for _ in 0..2 {
        let x = x.detach().set_requires_grad(true).unwrap();
        let y = layer.forward(&x).unwrap();
        y.mul(c).unwrap().sum_all().unwrap().backward().unwrap();
        let v = |t: Option<Tensor>| t.unwrap().to_f64_vec().unwrap();
        last = Some(Outcome {
            y: y.to_f64_vec().unwrap(),
            dx: v(x.grad()),
            dw: v(layer.weight.as_ref().unwrap().take_grad()),
            db: v(layer.bias.as_ref().unwrap().take_grad()),
            running_mean: v(layer.running_mean.clone()),
            running_var: v(layer.running_var.clone()),
        });
    }
    last.unwrap()
}

fn close(what: &str, a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: {x} against {y} (scale {scale:e}, tolerance {tol:e})"
        );
    }
}

/// Ranks with `rows[r]` samples each, against one batch norm on all rows.
fn check(rows: &[usize], dtype: DType, tol: f64) {
    let (c, h, w) = (3, 4, 5);
    let per_row = c * h * w;
    let total: usize = rows.iter().sum();
    let x_all = values(total * per_row, 1);
    let c_all = values(total * per_row, 2);
    let tensor = move |v: &[f64], n: usize| {
        Tensor::from_vec(v.to_vec(), &[n, c, h, w], Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let whole = train(
        &bn(c, dtype),
        &tensor(&x_all, total),
        &tensor(&c_all, total),
    );
    let ex = exchange(rows.len());
    let handles: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(rank, &n)| {
            let start = rows[..rank].iter().sum::<usize>() * per_row;
            let x = x_all[start..start + n * per_row].to_vec();
            let cr = c_all[start..start + n * per_row].to_vec();
            let ex = ex.clone();
            std::thread::spawn(move || {
                let mut layer = bn(c, dtype);
                let sync: Arc<dyn BatchStatsSync> = Arc::new(ThreadRank { rank, exchange: ex });
                assert_eq!(layer.sync_batch_norm(Some(&sync)), 1);
                assert!(layer.is_synced());
                train(&layer, &tensor(&x, n), &tensor(&cr, n))
            })
        })
        .collect();
    let ranks: Vec<Outcome> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let cat = |f: fn(&Outcome) -> &Vec<f64>| -> Vec<f64> {
        ranks.iter().flat_map(|o| f(o).clone()).collect()
    };
    close("y", &cat(|o| &o.y), &whole.y, tol);
    close("dx", &cat(|o| &o.dx), &whole.dx, tol);
    // The weight and bias gradients are each rank's share; data parallel
    // adds them up (averages, with the loss a mean per rank).
    let sum = |f: fn(&Outcome) -> &Vec<f64>| -> Vec<f64> {
        (0..c)
            .map(|i| ranks.iter().map(|o| f(o)[i]).sum())
            .collect()
    };
    close("dw", &sum(|o| &o.dw), &whole.dw, tol);
    close("db", &sum(|o| &o.db), &whole.db, tol);
    for (r, o) in ranks.iter().enumerate() {
        close(
            &format!("rank {r} running_mean"),
            &o.running_mean,
            &whole.running_mean,
            tol,
        );
        close(
            &format!("rank {r} running_var"),
            &o.running_var,
            &whole.running_var,
            tol,
        );
    }
    // Two steps: one gather per forward, one reduce per backward.
    assert_eq!(*ex.calls.lock().unwrap(), [2, 2]);
}

#[test]
fn synced_ranks_normalise_and_differentiate_as_one_batch_norm_on_the_whole_batch() {
    // f64: only the order of sums differs.
    check(&[2, 2], DType::F64, 1e-12);
    // Ranks of different sizes (the counts weight the combination), one
    // rank with a single sample.
    check(&[3, 1, 2], DType::F64, 1e-12);
    check(&[2, 2, 2, 2], DType::F64, 1e-12);
    // f32: per-channel sums rounded to f32 before they are added up.
    check(&[2, 3], DType::F32, 2e-6);
}

#[test]
fn per_rank_statistics_differ_from_the_whole_batch() {
    // The check above must be able to fail: unsynced ranks normalise with
    // their own batch's statistics.
    let (c, n) = (3, 2);
    let x = values(2 * n * c * 20, 1);
    let t = |v: &[f64], n: usize| Tensor::from_vec(v.to_vec(), &[n, c, 4, 5], Device::Cpu).unwrap();
    let whole = bn(c, DType::F64).forward(&t(&x, 2 * n)).unwrap();
    let half = bn(c, DType::F64).forward(&t(&x[..x.len() / 2], n)).unwrap();
    let a = half.to_f64_vec().unwrap();
    let b = whole.to_f64_vec().unwrap();
    let d = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(d > 1e-2, "{d}");
}

#[test]
fn eval_mode_and_a_world_of_one_exchange_nothing() {
    let ex = exchange(1);
    let mut layer = bn(3, DType::F32);
    let sync: Arc<dyn BatchStatsSync> = Arc::new(ThreadRank {
        rank: 0,
        exchange: ex.clone(),
    });
    layer.sync_batch_norm(Some(&sync));
    assert!(!layer.is_synced());
    let x = Tensor::from_vec(values(2 * 3 * 20, 3), &[2, 3, 4, 5], Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let y = layer.forward(&x).unwrap();
    let plain = bn(3, DType::F32).forward(&x).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), plain.to_vec::<f32>().unwrap());
    assert_eq!(*ex.calls.lock().unwrap(), [0, 0]);
    // Over two ranks, eval mode uses the running statistics: no exchange.
    let ex = exchange(2);
    let sync: Arc<dyn BatchStatsSync> = Arc::new(ThreadRank {
        rank: 0,
        exchange: ex.clone(),
    });
    layer.sync_batch_norm(Some(&sync));
    layer.set_training(false);
    layer.forward(&x).unwrap();
    assert_eq!(*ex.calls.lock().unwrap(), [0, 0]);
}

#[test]
fn converting_a_resnet_sets_every_batch_norm() {
    let config = ResNetConfig {
        base_width: 4,
        ..ResNetConfig::resnet18(5)
    };
    let mut m = ResNet::new(config, DType::F32, Device::Cpu, 1).unwrap();
    let ex = exchange(2);
    let sync: Arc<dyn BatchStatsSync> = Arc::new(ThreadRank {
        rank: 0,
        exchange: ex,
    });
    // ResNet-18: the stem's, two per basic block (8 blocks), three
    // downsampling shortcuts.
    assert_eq!(m.sync_batch_norm(Some(&sync)), 1 + 16 + 3);
    assert_eq!(m.sync_batch_norm(None), 20);
}

/// The tiny ResNet of the data-parallel tests, in f64.
fn tiny_resnet() -> ResNet {
    let config = ResNetConfig {
        base_width: 4,
        ..ResNetConfig::resnet18(5)
    };
    ResNet::new(config, DType::F64, Device::Cpu, 100).unwrap()
}

/// Images and labels of rows `rows` of step `step`'s batch.
fn rows_of(step: usize, rows: std::ops::Range<usize>) -> (Tensor, Tensor) {
    let px = 3 * 16 * 16;
    let n = rows.len();
    let v: Vec<f64> = rows
        .clone()
        .flat_map(|r| (0..px).map(move |i| ((r * px + i + step * 131) as f64 * 0.37).sin()))
        .collect();
    let labels: Vec<i64> = rows.map(|r| ((r + step) % 5) as i64).collect();
    (
        Tensor::from_vec(v, &[n, 3, 16, 16], Device::Cpu).unwrap(),
        Tensor::from_vec(labels, &[n], Device::Cpu).unwrap(),
    )
}

/// Three SGD steps (momentum 0.9) of the tiny ResNet with BatchNorm in
/// training mode on rows `rows` of each batch; with `sync`, as one rank of
/// data parallel (BatchNorm synchronised, gradients averaged over the
/// ranks). The parameters and running statistics after them.
fn train_resnet(rows: std::ops::Range<usize>, sync: Option<Arc<dyn BatchStatsSync>>) -> Vec<f64> {
    let mut model = tiny_resnet();
    if let Some(s) = &sync {
        assert_eq!(model.sync_batch_norm(Some(s)), 20);
    }
    let mut opt = Optimizer::new(model.parameters(), Sgd::new(0.05).momentum(0.9)).unwrap();
    for step in 0..3 {
        let (x, labels) = rows_of(step, rows.clone());
        let loss = model
            .forward(&x)
            .unwrap()
            .cross_entropy(&labels, CrossEntropyOptions::default())
            .unwrap();
        loss.backward().unwrap();
        if let Some(s) = &sync {
            let _ng = leangrad::autograd::no_grad();
            for p in model.parameters() {
                let g = p.grad().unwrap();
                s.all_reduce_sum(&g).unwrap();
                g.mul_scalar_(1.0 / s.world_size() as f64).unwrap();
            }
        }
        opt.step().unwrap();
        opt.zero_grad();
    }
    state(&model)
}

/// The parameters, then the f64 buffers (the running statistics).
fn state(model: &ResNet) -> Vec<f64> {
    let buffers = model.named_buffers().into_iter().map(|(_, b)| b);
    model
        .parameters()
        .into_iter()
        .chain(buffers.filter(|b| b.dtype() == DType::F64))
        .flat_map(|t| t.to_f64_vec().unwrap())
        .collect()
}

/// Data parallel over four ranks of two images, BatchNorm synchronised,
/// against one device on the eight: three steps in f64 agree to rounding
/// (this training is chaotic: a 1e-7 change of the first weights grows to
/// 1e-2 in three steps, so f32 on simulated devices checks one step).
#[test]
fn three_data_parallel_steps_with_sync_batch_norm_match_one_device_in_f64() {
    let whole = train_resnet(0..8, None);
    let ex = exchange(4);
    let handles: Vec<_> = (0..4)
        .map(|rank| {
            let ex = ex.clone();
            std::thread::spawn(move || {
                let sync: Arc<dyn BatchStatsSync> = Arc::new(ThreadRank { rank, exchange: ex });
                train_resnet(rank * 2..rank * 2 + 2, Some(sync))
            })
        })
        .collect();
    let ranks: Vec<Vec<f64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (r, values) in ranks.iter().enumerate() {
        assert_eq!(values, &ranks[0], "rank {r} differs from rank 0");
    }
    close("parameters and running statistics", &ranks[0], &whole, 1e-9);
    let start = state(&tiny_resnet());
    let d = start
        .iter()
        .zip(&whole)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(d > 1e-3, "the steps must train: {d}");
}
