//! What the tests across processes run on each rank (`nccl_process.rs`,
//! parent and children alike): ranks on threads, the inputs, the
//! reductions computed on the host in rank order, and every collective
//! checked bit for bit.
#![allow(dead_code)]

use super::nccl_common::*;
use half::bf16;
use leangrad_gpusim::driver::api_memory::cuMemsetD8Async;
use leangrad_gpusim::driver::consts::*;
use std::ptr::null_mut;

/// Ranks of the communicators: 2 processes × 2 devices.
pub const N: usize = 4;
/// Elements per rank of most calls.
pub const COUNT: usize = 37;

/// Runs `f(rank, comm)` for ranks `ranks` of `n`, rank `ranks[i]` on a
/// thread bound to device `i`; destroys the communicators.
pub fn ranks_here<T: Send>(
    ranks: &[usize],
    n: usize,
    id: NcclUniqueId,
    f: impl Fn(usize, NcclComm) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(dev, &rank)| {
                let f = &f;
                s.spawn(move || {
                    bind(dev);
                    let comm = init_rank(n, id, rank);
                    let out = f(rank, comm);
                    assert_eq!(ncclCommDestroy(comm), NCCL_SUCCESS);
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `r`'s f32 element `i`: magnitudes mixed, so that the order of the
/// additions shows in the result.
pub fn gen_f32(r: usize, i: usize) -> f32 {
    let base = ((r * 7 + i * 3) % 11) as f32 * 0.37 - 1.9;
    if i.is_multiple_of(4) && r.is_multiple_of(2) {
        base + 1.0e7
    } else {
        base * 1.0e-3
    }
}

pub fn gen_bf16(r: usize, i: usize) -> bf16 {
    let big = if i.is_multiple_of(3) {
        r as f32 * 100.0
    } else {
        0.0
    };
    bf16::from_f32(((r * 5 + i) % 13) as f32 * 0.173 - 1.1 + big)
}

/// Rank `r`'s f32s of `count` elements from element `from`.
pub fn f32_input(r: usize, from: usize, count: usize) -> Vec<u8> {
    bytes(
        &(from..from + count)
            .map(|i| gen_f32(r, i))
            .collect::<Vec<_>>(),
    )
}

/// The reduction of element `i` over ranks 0..N in rank order with `op`,
/// rounded in f32 at each step.
pub fn host_f32(i: usize, op: u32) -> f32 {
    let mut acc = gen_f32(0, i);
    for r in 1..N {
        let v = gen_f32(r, i);
        acc = match op {
            SUM | AVG => acc + v,
            PROD => acc * v,
            MAX => acc.max(v),
            _ => acc.min(v),
        };
    }
    if op == AVG {
        acc /= N as f32
    }
    acc
}

/// The same in bf16, each step computed in f32 and rounded to bf16.
pub fn host_bf16(i: usize, op: u32) -> bf16 {
    let mut acc = gen_bf16(0, i);
    for r in 1..N {
        acc = bf16::from_f32(acc.to_f32() + gen_bf16(r, i).to_f32());
    }
    if op == AVG {
        acc = bf16::from_f32(acc.to_f32() / N as f32);
    }
    acc
}

/// An all-reduce of `input` (`count` elements of `dtype`) on the default
/// stream, with a memset of the send buffer queued after it (stream order:
/// the collective reads it first); returns the result.
pub fn all_reduce(comm: NcclComm, input: &[u8], count: usize, dtype: u32, op: u32) -> Vec<u8> {
    let send = upload(input);
    let recv = alloc(input.len());
    let r = unsafe { ncclAllReduce(send as _, recv as _, count, dtype, op, comm, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS, "{}", nccl_error(r));
    assert_eq!(
        cuMemsetD8Async(send, 0, input.len(), null_mut()),
        CUDA_SUCCESS
    );
    read(recv, input.len())
}

/// Every collective once, checked on rank `rank`.
pub fn collectives(rank: usize, comm: NcclComm) {
    let input = f32_input(rank, 0, COUNT);
    for op in [SUM, AVG, PROD, MAX, MIN] {
        let want: Vec<f32> = (0..COUNT).map(|i| host_f32(i, op)).collect();
        let got = all_reduce(comm, &input, COUNT, F32, op);
        assert_eq!(got, bytes(&want), "f32 op {op} on rank {rank}");
    }
    let input16 = bytes(&(0..COUNT).map(|i| gen_bf16(rank, i)).collect::<Vec<_>>());
    for op in [SUM, AVG] {
        let want: Vec<bf16> = (0..COUNT).map(|i| host_bf16(i, op)).collect();
        let got = all_reduce(comm, &input16, COUNT, BF16, op);
        assert_eq!(got, bytes(&want), "bf16 op {op} on rank {rank}");
    }
    rooted(rank, comm, &input);
    gathers(rank, comm);
    ring(rank, comm);
}

/// Broadcast from rank 2 (another process for ranks 0 and 1) and a
/// reduce to rank 1.
pub fn rooted(rank: usize, comm: NcclComm, input: &[u8]) {
    let (send, recv) = (upload(input), alloc(input.len()));
    let r = unsafe { ncclBroadcast(send as _, recv as _, COUNT, F32, 2, comm, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS);
    assert_eq!(read(recv, input.len()), f32_input(2, 0, COUNT));
    let r = unsafe { ncclReduce(send as _, recv as _, COUNT, F32, SUM, 1, comm, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS);
    let got = read(recv, input.len());
    if rank == 1 {
        let want: Vec<f32> = (0..COUNT).map(|i| host_f32(i, SUM)).collect();
        assert_eq!(got, bytes(&want));
    } else {
        assert_eq!(
            got,
            f32_input(2, 0, COUNT),
            "a non-root's recvbuff is untouched"
        );
    }
}

/// All-gather of 5 elements per rank; reduce-scatter of 6 per rank.
pub fn gathers(rank: usize, comm: NcclComm) {
    let send = upload(&f32_input(rank, 0, 5));
    let recv = alloc(4 * 5 * N);
    let r = unsafe { ncclAllGather(send as _, recv as _, 5, F32, comm, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS);
    let want: Vec<u8> = (0..N).flat_map(|r| f32_input(r, 0, 5)).collect();
    assert_eq!(read(recv, 4 * 5 * N), want);
    let send = upload(&f32_input(rank, 0, 6 * N));
    let recv = alloc(4 * 6);
    let r = unsafe { ncclReduceScatter(send as _, recv as _, 6, F32, SUM, comm, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS);
    let want: Vec<f32> = (6 * rank..6 * rank + 6).map(|i| host_f32(i, SUM)).collect();
    assert_eq!(read(recv, 4 * 6), bytes(&want));
}

/// A ring of sends and receives in one group: rank r sends to r + 1 and
/// receives from r − 1 (ranks 1 → 2 and 3 → 0 cross processes).
pub fn ring(rank: usize, comm: NcclComm) {
    let (next, prev) = ((rank + 1) % N, (rank + N - 1) % N);
    let send = upload(&f32_input(rank, 0, COUNT));
    let recv = alloc(4 * COUNT);
    assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
    unsafe {
        assert_eq!(
            ncclSend(send as _, COUNT, F32, next as i32, comm, null_mut()),
            NCCL_SUCCESS
        );
        assert_eq!(
            ncclRecv(recv as _, COUNT, F32, prev as i32, comm, null_mut()),
            NCCL_SUCCESS
        );
    }
    assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
    assert_eq!(read(recv, 4 * COUNT), f32_input(prev, 0, COUNT));
}

/// Joins ranks `ranks` of N (rank `ranks[i]` on device i) and returns
/// their handles, not destroyed.
pub fn ranks_joined(ranks: &[usize], id: NcclUniqueId) -> Vec<Comm> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(dev, &rank)| {
                s.spawn(move || {
                    bind(dev);
                    Comm(init_rank(N, id, rank))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// One thread joins ranks `base` and `base + 1` in a group and runs a
/// grouped all-reduce on both devices.
pub fn grouped(base: usize, id: NcclUniqueId) {
    let mut comms = [null_mut(); 2];
    assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
    for (dev, c) in comms.iter_mut().enumerate() {
        bind(dev);
        let r = unsafe { ncclCommInitRank(c, N as i32, id, (base + dev) as i32) };
        assert_eq!(r, NCCL_SUCCESS);
    }
    assert_eq!(
        ncclGroupEnd(),
        NCCL_SUCCESS,
        "{}",
        nccl_error(NCCL_SYSTEM_ERROR)
    );
    let mut recvs = Vec::new();
    assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
    for (dev, &c) in comms.iter().enumerate() {
        bind(dev);
        let send = upload(&f32_input(base + dev, 0, COUNT));
        let recv = alloc(4 * COUNT);
        let r = unsafe { ncclAllReduce(send as _, recv as _, COUNT, F32, SUM, c, null_mut()) };
        assert_eq!(r, NCCL_SUCCESS);
        recvs.push(recv);
    }
    assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
    let want: Vec<f32> = (0..COUNT).map(|i| host_f32(i, SUM)).collect();
    for (dev, &recv) in recvs.iter().enumerate() {
        bind(dev);
        assert_eq!(read(recv, 4 * COUNT), bytes(&want));
    }
    for c in comms {
        assert_eq!(ncclCommDestroy(c), NCCL_SUCCESS);
    }
}
