//! Execution of NVRTC-compiled test kernels (tests/cuda/basic.cu) against
//! host references.
// Index loops mirror the kernels' thread indices, which reads clearer here.
#![allow(clippy::needless_range_loop)]

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
            ux.checked_div(uy).map_or(0, |q| q as i64),
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

#[test]
fn bf16_atomic_add_is_a_cas_loop() {
    let mut d = Dev::fixture("basic.ptx");
    assert!(std::fs::read_to_string(fixture("basic.ptx"))
        .unwrap()
        .contains("atom.global.cas.b16"));
    let n = 500usize;
    let idx: Vec<i32> = (0..n).map(|i| (i % 7) as i32).collect();
    // Small integers: every partial sum is exact in bf16, in any order.
    let src: Vec<u16> = (0..n)
        .map(|i| half::bf16::from_f32((i % 3) as f32).to_bits())
        .collect();
    let ia = d.upload(&i32s(&idx));
    let sa = d.upload(
        &src.iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let dst = d.zeros(2 * 7);
    d.launch(
        "scatter_add_bf16",
        2,
        256,
        &[p64(n as u64), p64(ia), p64(sa), p64(dst)],
    )
    .unwrap();
    let got = to_u16(&d.download(dst, 14));
    for k in 0..7 {
        let want: f32 = (0..n).filter(|i| i % 7 == k).map(|i| (i % 3) as f32).sum();
        assert_eq!(half::bf16::from_bits(got[k]).to_f32(), want, "slot {k}");
    }
}

#[test]
fn atomics_of_every_kind() {
    let mut d = Dev::fixture("basic.ptx");
    let n = 700usize;
    let mut rng = Rng(5);
    let x: Vec<i32> = (0..n).map(|_| (rng.next() % 2000) as i32 - 1000).collect();
    let xa = d.upload(&i32s(&x));
    let (fs, ds, cnt, imax, bits, hs) = (
        d.zeros(4),
        d.zeros(8),
        d.zeros(8),
        d.upload(&i32s(&[i32::MIN])),
        d.zeros(4),
        d.zeros(2),
    );
    d.launch(
        "atomics",
        3,
        256,
        &[
            p64(n as u64),
            p64(xa),
            p64(fs),
            p64(ds),
            p64(cnt),
            p64(imax),
            p64(bits),
            p64(hs),
        ],
    )
    .unwrap();
    let sum: i64 = x.iter().map(|&v| v as i64).sum();
    assert_eq!(to_f32(&d.download(fs, 4))[0], sum as f32); // |partial sums| < 2^24: exact
    assert_eq!(to_f64(&d.download(ds, 8))[0], sum as f64 * 0.5);
    assert_eq!(to_i64(&d.download(cnt, 8))[0], n as i64);
    assert_eq!(
        to_u32(&d.download(imax, 4))[0] as i32,
        *x.iter().max().unwrap()
    );
    let want_bits = x.iter().fold(0u32, |b, &v| b | 1 << (v & 31));
    assert_eq!(to_u32(&d.download(bits, 4))[0], want_bits);
    let hsum: i32 = x.iter().map(|&v| v & 3).sum();
    assert_eq!(
        half::f16::from_bits(to_u16(&d.download(hs, 2))[0]).to_f32(),
        hsum as f32
    );
}

#[test]
fn math_library_calls_locals_and_module_globals() {
    let mut d = Dev::fixture("basic.ptx");
    let text = std::fs::read_to_string(fixture("basic.ptx")).unwrap();
    assert!(
        text.contains("__cudart_i2opi_d")
            && text.contains("call.uni")
            && text.contains("__local_depot")
    );
    let mut x: Vec<f64> = (0..256).map(|i| (i as f64 - 128.0) * 0.37).collect();
    // Large arguments take the slow-path reduction (a call with a local depot
    // reading the module's __cudart_i2opi_d table).
    x.extend([1e6, -3.5e9, 1e22, 123456.789, 0.0, -0.0, 1e-310]);
    let n = x.len();
    let xa = d.upload(&f64s(&x));
    let (s, p) = (d.zeros(8 * n), d.zeros(8 * n));
    d.launch(
        "math_f64",
        2,
        256,
        &[p64(n as u64), p64(xa), p64(s), p64(p)],
    )
    .unwrap();
    let (gs, gp) = (to_f64(&d.download(s, 8 * n)), to_f64(&d.download(p, 8 * n)));
    for i in 0..n {
        let (ws, wp) = (x[i].sin(), x[i].powf(1.5));
        // CUDA's sin and pow are within 2 ulp (pow of a negative base is NaN).
        assert!(
            (gs[i] - ws).abs() <= 4.0 * f64::EPSILON * ws.abs().max(1e-300),
            "sin({}) = {} vs {}",
            x[i],
            gs[i],
            ws
        );
        if wp.is_nan() {
            assert!(gp[i].is_nan(), "pow({}) = {}", x[i], gp[i]);
        } else {
            assert!(
                (gp[i] - wp).abs() <= 4.0 * f64::EPSILON * wp.abs(),
                "pow({}) = {} vs {}",
                x[i],
                gp[i],
                wp
            );
        }
    }
}

#[test]
fn half_conversions() {
    let mut d = Dev::fixture("basic.ptx");
    let x: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        1.0 / 3.0,
        65504.0,
        70000.0,
        1e-6,
        -2.5e-8,
        3.0e38,
        f32::INFINITY,
        1.0 + 1.0 / 256.0,
    ];
    let n = x.len();
    let xa = d.upload(&f32s(&x));
    let (h, b, back) = (d.zeros(2 * n), d.zeros(2 * n), d.zeros(4 * n));
    d.launch(
        "halves",
        1,
        32,
        &[p64(n as u64), p64(xa), p64(h), p64(b), p64(back)],
    )
    .unwrap();
    let (gh, gb, gback) = (
        to_u16(&d.download(h, 2 * n)),
        to_u16(&d.download(b, 2 * n)),
        to_f32(&d.download(back, 4 * n)),
    );
    for i in 0..n {
        let (wh, wb) = (half::f16::from_f32(x[i]), half::bf16::from_f32(x[i]));
        assert_eq!(gh[i], wh.to_bits(), "f16({})", x[i]);
        assert_eq!(gb[i], wb.to_bits(), "bf16({})", x[i]);
        assert_eq!(
            gback[i].to_bits(),
            (wh.to_f32() + wb.to_f32()).to_bits(),
            "back({})",
            x[i]
        );
    }
}

/// leangrad's `Strided` layout (kernels/common.cuh), as the 144-byte struct
/// parameter the kernels take by value.
fn strided(offset: i64, shape: &[i64], strides: &[i64]) -> Vec<u8> {
    let mut v = vec![shape.len() as i64, offset];
    let mut sh = [0i64; 8];
    let mut st = [0i64; 8];
    sh[..shape.len()].copy_from_slice(shape);
    st[..strides.len()].copy_from_slice(strides);
    v.extend(sh);
    v.extend(st);
    i64s(&v)
}

#[test]
fn leangrad_relu_mask_kernel_with_struct_parameter() {
    // relu_mask_fwd_f32 from src/ops/mask/relu_mask.cu as NVRTC compiles it.
    let mut d = Dev::fixture("relu_mask_fwd_f32.ptx");
    let (rows, cols) = (37usize, 29usize);
    let n = rows * cols;
    let mut rng = Rng(9);
    let mut buf: Vec<f32> = (0..n + 5).map(|_| rng.unit() as f32).collect();
    buf[10] = f32::NAN;
    let xa = d.upload(&f32s(&buf));
    for (layout, slope) in [
        (strided(0, &[n as i64], &[1]), 0.0),
        // A transposed view with an offset: the division/remainder path.
        (
            strided(5, &[rows as i64, cols as i64], &[1, rows as i64]),
            0.125,
        ),
    ] {
        let y = d.zeros(4 * n);
        let words = n.div_ceil(32);
        let mask = d.zeros(4 * words);
        d.launch(
            "relu_mask_fwd_f32",
            3,
            256,
            &[
                p64(f64::to_bits(slope)),
                p64(n as u64),
                p64(y),
                p64(mask),
                p64(xa),
                layout.clone(),
            ],
        )
        .unwrap();
        let (gy, gm) = (
            to_f32(&d.download(y, 4 * n)),
            to_u32(&d.download(mask, 4 * words)),
        );
        let rank = i64::from_le_bytes(layout[..8].try_into().unwrap());
        for i in 0..n {
            let off = if rank == 1 {
                i
            } else {
                5 + (i % cols) * rows + i / cols
            };
            let v = buf[off];
            let pos = v > 0.0;
            let want = if pos {
                v
            } else if slope == 0.0 && !v.is_nan() {
                0.0
            } else {
                v * slope as f32
            };
            assert_eq!(gy[i].to_bits(), want.to_bits(), "i={i} x={v}");
            assert_eq!(gm[i / 32] >> (i % 32) & 1, pos as u32, "mask bit {i}");
        }
    }
}

#[test]
fn early_return_before_a_barrier() {
    let mut d = Dev::fixture("basic.ptx");
    let n = 45usize; // the second warp is split by the return
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 1.5).collect();
    let xa = d.upload(&f32s(&x));
    let out = d.zeros(4 * 64);
    d.launch(
        "early_return_barrier",
        1,
        64,
        &[p32(n as u32), p64(xa), p64(out)],
    )
    .unwrap();
    let got = to_f32(&d.download(out, 4 * 64));
    for t in 0..64 {
        assert_eq!(got[t], if t < n { x[n - 1 - t] } else { 0.0 }, "t={t}");
    }
}
