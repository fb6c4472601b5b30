//! Process groups on CUDA through NCCL: ranks as threads, one CUDA device
//! each (the simulated GPU opens four: `GPUSIM_DEVICE_COUNT`, set here
//! before the first CUDA call), joined by the TCP rendezvous. Collectives
//! give the values a rank-order reduction gives, bit for bit; they run in
//! stream order with the kernels around them; a collective the ranks call
//! differently, or one a rank never calls, is an error on the ranks that
//! wait, not a hang. Without enough devices the tests print a skip (a
//! failure under `LEANGRAD_REQUIRE_CUDA=1`).
mod cuda_common;
mod distributed_common;
use distributed_common::{have_devices, on_ranks};
use leangrad::distributed::ReduceOp;
use leangrad::{DType, Device, Tensor};
use std::time::{Duration, Instant};

/// `values` as a tensor of `dtype` on `device`.
fn on(device: Device, values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(
        values.iter().map(|&v| v as f32).collect(),
        shape,
        Device::Cpu,
    )
    .unwrap()
    .to_dtype(dtype)
    .unwrap()
    .to_device(device)
    .unwrap()
}

/// Rank `r`'s six values: small integers, exact in every float dtype.
fn rank_values(r: usize) -> Vec<f64> {
    (0..6).map(|i| (r * 10 + i) as f64 - 7.0).collect()
}

#[test]
fn collectives_give_rank_order_results_on_two_and_four_devices() {
    for world in [2, 4] {
        if !have_devices("collectives", world) {
            return;
        }
        let got = on_ranks(world, move |g| {
            let r = g.rank();
            let x = |dtype| on(g.device(), &rank_values(r), &[2, 3], dtype);
            let mut out = Vec::new();
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
                let t = x(DType::F32);
                g.all_reduce(&t, op).unwrap();
                out.push(t.to_f64_vec().unwrap());
            }
            let b = x(DType::F32);
            g.broadcast(&b, world - 1).unwrap();
            out.push(b.to_f64_vec().unwrap());
            let gathered = g.all_gather(&x(DType::F32)).unwrap();
            assert_eq!(gathered.shape(), &[world, 2, 3]);
            out.push(gathered.to_f64_vec().unwrap());
            // Block j of rank r's input holds 100·j + r.
            let blocks: Vec<f64> = (0..world)
                .flat_map(|j| (0..3).map(move |i| (100 * j + r + i) as f64))
                .collect();
            let input = on(g.device(), &blocks, &[world, 3], DType::F32);
            let mine = g.reduce_scatter(&input, ReduceOp::Sum).unwrap();
            assert_eq!(mine.shape(), &[3]);
            out.push(mine.to_f64_vec().unwrap());
            g.barrier().unwrap();
            out
        });
        let all: Vec<Vec<f64>> = (0..world).map(rank_values).collect();
        let fold = |f: fn(f64, f64) -> f64| -> Vec<f64> {
            (0..6)
                .map(|i| all.iter().map(|v| v[i]).reduce(f).unwrap())
                .collect()
        };
        let sum = fold(|a, b| a + b);
        let avg: Vec<f64> = sum.iter().map(|s| s / world as f64).collect();
        for (rank, out) in got.iter().enumerate() {
            let what = format!("world {world}, rank {rank}");
            assert_eq!(out[0], sum, "sum, {what}");
            assert_eq!(out[1], avg, "avg, {what}");
            assert_eq!(out[2], fold(f64::max), "max, {what}");
            assert_eq!(out[3], fold(f64::min), "min, {what}");
            assert_eq!(out[4], all[world - 1], "broadcast, {what}");
            assert_eq!(out[5], all.concat(), "all_gather, {what}");
            let scattered: Vec<f64> = (0..3)
                .map(|i| (0..world).map(|r| (100 * rank + r + i) as f64).sum())
                .collect();
            assert_eq!(out[6], scattered, "reduce_scatter, {what}");
        }
    }
}

#[test]
fn half_precision_and_integer_sums_round_as_a_rank_order_sum() {
    let world = 4;
    if !have_devices("half precision sums", world) {
        return;
    }
    // Values whose bf16/f16 sums round at every addition.
    let values = |r: usize| -> Vec<f64> {
        (0..64)
            .map(|i| ((i * 37 + r * 101) % 97) as f64 / 7.0 - 5.0)
            .collect()
    };
    for dtype in [DType::BF16, DType::F16, DType::F32, DType::I64] {
        let got = on_ranks(world, move |g| {
            let t = on(g.device(), &values(g.rank()), &[64], dtype);
            g.all_reduce(&t, ReduceOp::Sum).unwrap();
            t.to_f64_vec().unwrap()
        });
        // The CPU's sum in rank order, rounded in `dtype` at every step
        // (integers: exact).
        let rank_tensor = |r| on(Device::Cpu, &values(r), &[64], dtype);
        let want: Vec<f64> = if dtype == DType::I64 {
            let ints: Vec<Vec<f64>> = (0..world)
                .map(|r| rank_tensor(r).to_f64_vec().unwrap())
                .collect();
            (0..64).map(|i| ints.iter().map(|v| v[i]).sum()).collect()
        } else {
            let mut acc = rank_tensor(0);
            for r in 1..world {
                acc = acc.add(&rank_tensor(r)).unwrap();
            }
            acc.to_f64_vec().unwrap()
        };
        for (rank, g) in got.iter().enumerate() {
            assert_eq!(g, &want, "{dtype:?}, rank {rank}");
        }
    }
}

#[test]
fn a_collective_runs_in_stream_order_with_the_kernels_around_it() {
    let world = 2;
    if !have_devices("stream order", world) {
        return;
    }
    let got = on_ranks(world, |g| {
        let x = on(g.device(), &[1.0, 2.0, 3.0], &[3], DType::F32);
        // A kernel before (queued, not run yet), the collective, one after.
        let y = x.mul_scalar((g.rank() + 1) as f64).unwrap();
        g.all_reduce(&y, ReduceOp::Sum).unwrap();
        let z = y.add_scalar(0.5).unwrap();
        z.to_f64_vec().unwrap()
    });
    for out in got {
        assert_eq!(out, vec![3.5, 6.5, 9.5]);
    }
}

#[test]
fn ranks_that_disagree_or_stop_get_an_error_not_a_hang() {
    let world = 2;
    if !have_devices("faults", world) {
        return;
    }
    // Different element counts for the same collective.
    let got = on_ranks(world, |g| {
        let n = 4 + g.rank();
        let t = on(g.device(), &vec![1.0; n], &[n], DType::F32);
        g.all_reduce(&t, ReduceOp::Sum)
            .and_then(|_| t.to_f64_vec())
            .map_err(|e| e.to_string())
    });
    for (rank, r) in got.iter().enumerate() {
        let e = r.as_ref().expect_err("mismatched counts must fail");
        assert!(e.contains('4') && e.contains('5'), "rank {rank}: {e}");
    }
    // Rank 1 leaves without the collective rank 0 waits in.
    let start = Instant::now();
    let got = on_ranks(world, |g| {
        if g.rank() == 1 {
            return Ok(vec![]);
        }
        let t = on(g.device(), &[1.0; 4], &[4], DType::F32);
        g.all_reduce(&t, ReduceOp::Sum)
            .and_then(|_| t.to_f64_vec())
            .map_err(|e| e.to_string())
    });
    assert!(got[0].is_err(), "{:?}", got[0]);
    assert!(
        start.elapsed() < Duration::from_secs(25),
        "{:?}",
        start.elapsed()
    );
}
