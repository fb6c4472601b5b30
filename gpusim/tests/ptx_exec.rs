//! Execution of NVRTC-compiled test kernels (tests/cuda/basic.cu) against
//! host references.

mod ptx_common;
use ptx_common::*;

#[test]
fn elementwise_add() {
    let mut d = Dev::fixture("basic.ptx");
    let n = 1000usize;
    let mut rng = Rng(7);
    let x: Vec<f32> = (0..n).map(|_| rng.unit() as f32).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.unit() as f32 * 100.0).collect();
    let (xa, ya) = (d.upload(&f32s(&x)), d.upload(&f32s(&y)));
    let out = d.zeros(4 * n);
    let st = d
        .launch(
            "add_f32",
            8,
            128,
            &[p64(n as u64), p64(xa), p64(ya), p64(out)],
        )
        .unwrap();
    let got = to_f32(&d.download(out, 4 * n));
    for i in 0..n {
        assert_eq!(got[i].to_bits(), ((x[i] + y[i]) * 2.0).to_bits(), "i={i}");
    }
    assert!(st.thread_instructions > 10 * n as u64, "{st:?}");
    assert!(st.warp_instructions * 32 >= st.thread_instructions);
}

#[test]
fn divergent_loops() {
    let mut d = Dev::fixture("basic.ptx");
    let n = 300usize;
    let out = d.zeros(4 * n);
    d.launch("collatz", 3, 128, &[p32(n as u32), p64(out)])
        .unwrap();
    let got = to_u32(&d.download(out, 4 * n));
    for i in 0..n {
        let (mut v, mut s) = (i as u64 + 1, 0u32);
        while v != 1 {
            v = if v & 1 == 1 { 3 * v + 1 } else { v >> 1 };
            s += 1;
        }
        assert_eq!(got[i], s, "i={i}");
    }
}

#[test]
fn ballot_after_divergent_branches() {
    let mut d = Dev::fixture("basic.ptx");
    let n = 1000usize; // not a multiple of 32: the last word's lanes partly skip the load
    let mut rng = Rng(3);
    let x: Vec<f32> = (0..n).map(|_| rng.unit() as f32 * 3.0).collect();
    let xa = d.upload(&f32s(&x));
    let y = d.zeros(4 * n);
    let words = n.div_ceil(32);
    let mask = d.zeros(4 * words);
    // 2 blocks of 64 threads = 4 warps for 32 words: the grid-stride loop runs 8 times.
    d.launch(
        "ballot_mask",
        2,
        64,
        &[p64(n as u64), p64(xa), p64(y), p64(mask)],
    )
    .unwrap();
    let got = to_u32(&d.download(mask, 4 * words));
    let ys = to_f32(&d.download(y, 4 * n));
    for w in 0..words {
        let mut want = 0u32;
        for l in 0..32 {
            let i = w * 32 + l;
            if i < n && x[i] > 0.0 {
                want |= 1 << l;
            }
        }
        assert_eq!(got[w], want, "word {w}");
    }
    for i in 0..n {
        let want = if x[i] > 0.0 {
            x[i]
        } else if x[i] < -1.0 {
            -1.0
        } else {
            0.0
        };
        assert_eq!(ys[i], want, "i={i}");
    }
}

#[test]
fn block_reduction_with_barriers() {
    let mut d = Dev::fixture("basic.ptx");
    let n = 1000usize;
    let x: Vec<f64> = (0..n).map(|i| (i as f64) * 0.25 + 1.0).collect();
    let xa = d.upload(&f64s(&x));
    let blocks = n.div_ceil(256);
    let out = d.zeros(8 * blocks);
    d.launch(
        "block_sum",
        blocks as u32,
        256,
        &[p64(n as u64), p64(xa), p64(out)],
    )
    .unwrap();
    let got = to_f64(&d.download(out, 8 * blocks));
    for b in 0..blocks {
        // The tree order of the kernel, on the host.
        let mut buf: Vec<f64> = (0..256)
            .map(|t| x.get(b * 256 + t).copied().unwrap_or(0.0))
            .collect();
        let mut s = 128;
        while s > 0 {
            for t in 0..s {
                buf[t] += buf[t + s];
            }
            s >>= 1;
        }
        assert_eq!(got[b], buf[0], "block {b}");
    }
}

#[test]
fn integer_semantics_match_the_host() {
    let mut d = Dev::fixture("basic.ptx");
    let mut rng = Rng(11);
    let n = 200usize;
    let mut a: Vec<i64> = (0..n)
        .map(|_| rng.next() as i64 >> (rng.next() % 60))
        .collect();
    let mut b: Vec<i64> = (0..n)
        .map(|_| rng.next() as i64 >> (rng.next() % 63))
        .collect();
    a[0] = i64::MIN;
    b[0] = -1;
    b[1] = 0;
    a[2] = 0;
    let (aa, ba) = (d.upload(&i64s(&a)), d.upload(&i64s(&b)));
    let out = d.zeros(8 * 12 * n);
    d.launch(
        "int_ops",
        1,
        256,
        &[p64(n as u64), p64(aa), p64(ba), p64(out)],
    )
    .unwrap();
    let got = to_i64(&d.download(out, 8 * 12 * n));
    for i in 0..n {
        let (x, y) = (a[i], b[i]);
        let (ux, uy) = (x as u64, y as u64);
        let want = [
            if y != 0 { x.wrapping_div(y) } else { 0 },
            if y != 0 { x.wrapping_rem(y) } else { 0 },
            if uy != 0 { (ux / uy) as i64 } else { 0 },
            ((x as i128 * y as i128) >> 64) as i64,
            ((ux as u128 * uy as u128) >> 64) as i64,
            x >> (y & 63),
            (ux >> (uy & 63)) as i64,
            x.leading_zeros() as i64 + 100 * x.count_ones() as i64,
            ux.reverse_bits() as i64,
            x.min(y) ^ ux.max(uy) as i64,
            // int + unsigned is unsigned in C, then zero-extended.
            ((x as i32).wrapping_div(y as i32 | 1) as u32).wrapping_add(x as u32 % (y as u32 | 1))
                as i64,
            (x as i16 as i32 * y as i16 as i32 + x as u8 as i32) as i64,
        ];
        assert_eq!(&got[12 * i..12 * i + 12], &want, "i={i} a={x} b={y}");
    }
}
