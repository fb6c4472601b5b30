//! The NCCL stand-in's collectives on 2 and 4 simulated devices: ranks as
//! threads (`ncclCommInitRank`) and one thread driving every device
//! (`ncclCommInitAll` + `ncclGroupStart`/`ncclGroupEnd`); results
//! bit-exact against reductions computed here in rank order; in-place
//! calls; sends and receives.

mod nccl_common;
use half::{bf16, f16};
use nccl_common::*;
use std::ffi::c_void;
use std::ptr::null_mut;

const DEVICES: usize = 4;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let g = serial();
    init(DEVICES, None);
    g
}

/// An element type with the arithmetic the test expects: each step
/// rounded in the type (halves through f32), integers wrapping.
trait Num: Le + PartialEq + std::fmt::Debug {
    const NCCL: u32;
    /// Rank `r`'s element `i`: magnitudes mixed so that the order of the
    /// additions shows in the result.
    fn gen(r: usize, i: usize) -> Self;
    fn add(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn div(self, n: usize) -> Self;
    fn from_le(b: &[u8]) -> Self;
}

impl Num for f32 {
    const NCCL: u32 = F32;
    fn gen(r: usize, i: usize) -> f32 {
        let base = ((r * 7 + i * 3) % 11) as f32 * 0.37 - 1.9;
        if i.is_multiple_of(4) && r.is_multiple_of(2) {
            base + 1.0e7
        } else {
            base * 1.0e-3
        }
    }
    fn add(self, o: f32) -> f32 {
        self + o
    }
    fn max(self, o: f32) -> f32 {
        f32::max(self, o)
    }
    fn div(self, n: usize) -> f32 {
        self / n as f32
    }
    fn from_le(b: &[u8]) -> f32 {
        f32::from_le_bytes(b.try_into().unwrap())
    }
}

macro_rules! half_num {
    ($t:ty, $nccl:expr) => {
        impl Num for $t {
            const NCCL: u32 = $nccl;
            fn gen(r: usize, i: usize) -> $t {
                let big = if i.is_multiple_of(3) {
                    r as f32 * 100.0
                } else {
                    0.0
                };
                <$t>::from_f32(((r * 5 + i) % 13) as f32 * 0.173 - 1.1 + big)
            }
            fn add(self, o: $t) -> $t {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            fn max(self, o: $t) -> $t {
                if o > self {
                    o
                } else {
                    self
                }
            }
            fn div(self, n: usize) -> $t {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
            fn from_le(b: &[u8]) -> $t {
                <$t>::from_le_bytes(b.try_into().unwrap())
            }
        }
    };
}
half_num!(f16, F16);
half_num!(bf16, BF16);

impl Num for i64 {
    const NCCL: u32 = I64;
    fn gen(r: usize, i: usize) -> i64 {
        // Large enough that four of them wrap.
        i64::MAX / 3 + r as i64 * 1_000_003 - i as i64 * 77
    }
    fn add(self, o: i64) -> i64 {
        self.wrapping_add(o)
    }
    fn max(self, o: i64) -> i64 {
        Ord::max(self, o)
    }
    fn div(self, n: usize) -> i64 {
        self / n as i64
    }
    fn from_le(b: &[u8]) -> i64 {
        i64::from_le_bytes(b.try_into().unwrap())
    }
}

/// The expected reduction of `count` elements over `n` ranks, rank order.
fn expected<T: Num>(op: u32, n: usize, count: usize) -> Vec<T> {
    (0..count)
        .map(|i| {
            let mut acc = T::gen(0, i);
            for r in 1..n {
                let x = T::gen(r, i);
                acc = if op == MAX { acc.max(x) } else { acc.add(x) };
            }
            if op == AVG {
                acc.div(n)
            } else {
                acc
            }
        })
        .collect()
}

fn decode<T: Num>(b: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    b.chunks_exact(size).map(T::from_le).collect()
}

/// All-reduces rank-generated data of type `T` with `op` on this rank;
/// returns what the rank received.
fn all_reduce_rank<T: Num>(rank: usize, comm: NcclComm, op: u32, count: usize) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let send = upload(&bytes(
        &(0..count).map(|i| T::gen(rank, i)).collect::<Vec<_>>(),
    ));
    let recv = alloc(count * size);
    let r = unsafe { ncclAllReduce(send as _, recv as _, count, T::NCCL, op, comm, null_mut()) };
    assert_eq!(r, NCCL_SUCCESS, "{}", nccl_error(r));
    decode(&read(recv, count * size))
}

fn check_type<T: Num>(n: usize, rank: usize, comm: NcclComm) {
    let count = 37;
    for op in [SUM, AVG, MAX] {
        let got: Vec<T> = all_reduce_rank(rank, comm, op, count);
        let want = expected::<T>(op, n, count);
        let bits = |v: &[T]| bytes(v);
        assert_eq!(
            bits(&got),
            bits(&want),
            "rank {rank} of {n}, op {op}: {got:?} vs {want:?}"
        );
    }
}

#[test]
fn all_reduce_is_bit_exact_in_rank_order_with_ranks_as_threads() {
    let _g = setup();
    let before = leangrad_gpusim::driver::stats().collectives;
    for n in [2, 4] {
        ranks_as_threads(n, |rank, comm| {
            check_type::<f32>(n, rank, comm);
            check_type::<f16>(n, rank, comm);
            check_type::<bf16>(n, rank, comm);
            check_type::<i64>(n, rank, comm);
        });
    }
    // 12 all-reduces per rank, counted per rank.
    let after = leangrad_gpusim::driver::stats().collectives;
    assert!(after - before >= 12 * (2 + 4), "{before} → {after}");
}

#[test]
fn the_order_of_the_ranks_shows_in_f32_sums() {
    let _g = setup();
    // 1 + ε/2 + ε/2 rounds to 1 at each step in rank order, whatever the
    // exact sum: the reduction is sequential, not a tree.
    let eps = f32::EPSILON / 2.0;
    let out = ranks_as_threads(3, |rank, comm| {
        let v = if rank == 0 { 1.0f32 } else { eps };
        let send = upload(&bytes(&[v]));
        let recv = alloc(4);
        let r = unsafe { ncclAllReduce(send as _, recv as _, 1, F32, SUM, comm, null_mut()) };
        assert_eq!(r, NCCL_SUCCESS);
        f32::from_le(&read(recv, 4))
    });
    assert_eq!(out, vec![1.0f32; 3]);
}

#[test]
fn one_thread_drives_every_device_through_a_group() {
    let _g = setup();
    let n = DEVICES;
    let comms = init_all(n);
    for (rank, &c) in comms.iter().enumerate() {
        let (mut count, mut dev, mut me) = (0, 0, 0);
        unsafe {
            assert_eq!(ncclCommCount(c, &mut count), NCCL_SUCCESS);
            assert_eq!(ncclCommCuDevice(c, &mut dev), NCCL_SUCCESS);
            assert_eq!(ncclCommUserRank(c, &mut me), NCCL_SUCCESS);
        }
        assert_eq!((count, dev, me), (n as i32, rank as i32, rank as i32));
    }
    let count = 5;
    let data = |r: usize| -> Vec<f32> { (0..n * count).map(|i| (r * 100 + i) as f32).collect() };
    let (mut send, mut recv, mut gathered, mut scattered, mut bcast) =
        (vec![], vec![], vec![], vec![], vec![]);
    for r in 0..n {
        bind(r);
        send.push(upload(&bytes(&data(r))));
        recv.push(alloc(4 * count));
        gathered.push(alloc(4 * n * count));
        scattered.push(alloc(4 * count));
        bcast.push(alloc(4 * count));
    }
    group(n, |r| unsafe {
        let (s, c) = (send[r] as *const c_void, comms[r]);
        assert_eq!(
            ncclAllReduce(s, recv[r] as _, count, F32, SUM, c, null_mut()),
            NCCL_SUCCESS
        );
        assert_eq!(
            ncclAllGather(s, gathered[r] as _, count, F32, c, null_mut()),
            NCCL_SUCCESS
        );
        assert_eq!(
            ncclReduceScatter(s, scattered[r] as _, count, F32, MAX, c, null_mut()),
            NCCL_SUCCESS
        );
        let bsend = if r == 2 { s } else { std::ptr::null() };
        assert_eq!(
            ncclBroadcast(bsend, bcast[r] as _, count, F32, 2, c, null_mut()),
            NCCL_SUCCESS
        );
    });
    for r in 0..n {
        bind(r);
        let sum: Vec<f32> = (0..count)
            .map(|i| (0..n).map(|q| data(q)[i]).sum())
            .collect();
        assert_eq!(f32s(&read(recv[r], 4 * count)), sum, "all-reduce, rank {r}");
        let all: Vec<f32> = (0..n).flat_map(|q| data(q)[..count].to_vec()).collect();
        assert_eq!(
            f32s(&read(gathered[r], 4 * n * count)),
            all,
            "all-gather, rank {r}"
        );
        let block: Vec<f32> = (0..count).map(|i| data(n - 1)[r * count + i]).collect();
        assert_eq!(
            f32s(&read(scattered[r], 4 * count)),
            block,
            "reduce-scatter (max), rank {r}"
        );
        assert_eq!(
            f32s(&read(bcast[r], 4 * count)),
            data(2)[..count].to_vec(),
            "broadcast, rank {r}"
        );
    }
    for c in comms {
        assert_eq!(ncclCommDestroy(c), NCCL_SUCCESS);
    }
}

#[test]
fn in_place_calls_and_reduce_to_a_root() {
    let _g = setup();
    let n = 2;
    let comms = init_all(n);
    let count = 3;
    let (mut buf, mut gat, mut rs, mut red) = (vec![], vec![], vec![], vec![]);
    for r in 0..n {
        bind(r);
        buf.push(upload(&bytes(&[r as i64 + 1, 10, -3])));
        // All-gather in place: rank r's block already at r·count.
        let mut g = vec![0i64; n * count];
        g[r * count..(r + 1) * count].copy_from_slice(&[r as i64; 3]);
        gat.push(upload(&bytes(&g)));
        rs.push(upload(&bytes(
            &(0..n * count)
                .map(|i| (i * (r + 1)) as i64)
                .collect::<Vec<_>>(),
        )));
        red.push(upload(&bytes(&[2 + r as i64, 3 - r as i64, 4])));
    }
    group(n, |r| unsafe {
        let c = comms[r];
        assert_eq!(
            ncclAllReduce(buf[r] as _, buf[r] as _, count, I64, PROD, c, null_mut()),
            NCCL_SUCCESS
        );
        let mine = gat[r] + (r * count * 8) as u64;
        assert_eq!(
            ncclAllGather(mine as _, gat[r] as _, count, I64, c, null_mut()),
            NCCL_SUCCESS
        );
        let mine = rs[r] + (r * count * 8) as u64;
        assert_eq!(
            ncclReduceScatter(rs[r] as _, mine as _, count, I64, SUM, c, null_mut()),
            NCCL_SUCCESS
        );
        let recv = if r == 1 {
            red[r] as *mut c_void
        } else {
            null_mut()
        };
        assert_eq!(
            ncclReduce(red[r] as _, recv, count, I64, MIN, 1, c, null_mut()),
            NCCL_SUCCESS
        );
    });
    for r in 0..n {
        bind(r);
        assert_eq!(decode::<i64>(&read(buf[r], 24)), vec![2, 100, 9]);
        assert_eq!(decode::<i64>(&read(gat[r], 48)), vec![0, 0, 0, 1, 1, 1]);
        let block: Vec<i64> = (0..count).map(|i| ((r * count + i) * 3) as i64).collect();
        assert_eq!(decode::<i64>(&read(rs[r] + (r * 24) as u64, 24)), block);
        // The root gets the minimum; rank 0's receive buffer is not touched.
        let want = if r == 1 { vec![2, 2, 4] } else { vec![2, 3, 4] };
        assert_eq!(decode::<i64>(&read(red[r], 24)), want);
    }
    for c in comms {
        assert_eq!(ncclCommDestroy(c), NCCL_SUCCESS);
    }
}

#[test]
fn sends_and_receives_pair_up_in_a_ring_and_one_to_one() {
    let _g = setup();
    let n = DEVICES;
    let got = ranks_as_threads(n, |rank, comm| unsafe {
        let mine = upload(&bytes(&[rank as f32; 4]));
        let from_left = alloc(16);
        // A ring exchange needs a group (both directions at once).
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        assert_eq!(
            ncclSend(mine as _, 4, F32, ((rank + 1) % n) as i32, comm, null_mut()),
            NCCL_SUCCESS
        );
        assert_eq!(
            ncclRecv(
                from_left as _,
                4,
                F32,
                ((rank + n - 1) % n) as i32,
                comm,
                null_mut()
            ),
            NCCL_SUCCESS
        );
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
        // One way, ungrouped: rank 0 to rank 3.
        let extra = alloc(8);
        if rank == 0 {
            let v = upload(&bytes(&[7i32, 8]));
            assert_eq!(ncclSend(v as _, 2, 2, 3, comm, null_mut()), NCCL_SUCCESS);
        } else if rank == 3 {
            assert_eq!(
                ncclRecv(extra as _, 2, 2, 0, comm, null_mut()),
                NCCL_SUCCESS
            );
        }
        let ring = f32s(&read(from_left, 16));
        let one = (rank == 3).then(|| read(extra, 8));
        (ring, one)
    });
    for (rank, (ring, one)) in got.into_iter().enumerate() {
        assert_eq!(ring, vec![((rank + n - 1) % n) as f32; 4]);
        if rank == 3 {
            assert_eq!(one.unwrap(), bytes(&[7i32, 8]));
        }
    }
}

#[test]
fn many_collectives_queued_before_any_synchronisation() {
    let _g = setup();
    let n = DEVICES;
    let out = ranks_as_threads(n, |_rank, comm| unsafe {
        let b = upload(&bytes(&[1.0f64]));
        let p = b as *mut c_void;
        // Each round multiplies the value by n; nothing runs until the read.
        for _ in 0..20 {
            assert_eq!(
                ncclAllReduce(p, p, 1, 8, SUM, comm, null_mut()),
                NCCL_SUCCESS
            );
        }
        f64::from_le_bytes(read(b, 8).try_into().unwrap())
    });
    assert_eq!(out, vec![(n as f64).powi(20); n]);
}
