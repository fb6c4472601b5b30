//! Throughput of the interpreter on a kernel-heavy workload (an elementwise
//! kernel over 2^20 elements, a block reduction with barriers over 2^20
//! elements); prints thread-instructions per second. Run in release:
//! `cargo test -p leangrad-gpusim --release --test ptx_throughput -- --nocapture`.

mod ptx_common;
use ptx_common::*;
use std::time::Instant;

#[test]
fn throughput() {
    let mut d = Dev::fixture("basic.ptx");
    let n = 1usize << 20;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let (xa, ya) = (d.upload(&f32s(&x)), d.upload(&f32s(&y)));
    let out = d.zeros(4 * n);
    let t = Instant::now();
    let st = d
        .launch(
            "add_f32",
            (n / 256) as u32,
            256,
            &[p64(n as u64), p64(xa), p64(ya), p64(out)],
        )
        .unwrap();
    let dt = t.elapsed().as_secs_f64();
    let got = to_f32(&d.download(out, 4 * n));
    assert!((0..n).all(|i| got[i] == (x[i] + y[i]) * 2.0));
    println!(
        "elementwise add_f32, 2^20 elements: {} thread-instructions in {:.3} s = {:.3e} /s",
        st.thread_instructions,
        dt,
        st.thread_instructions as f64 / dt
    );
    let xd: Vec<f64> = (0..n).map(|i| (i % 1000) as f64).collect();
    let xda = d.upload(&f64s(&xd));
    let blocks = n / 256;
    let sums = d.zeros(8 * blocks);
    let t = Instant::now();
    let st2 = d
        .launch(
            "block_sum",
            blocks as u32,
            256,
            &[p64(n as u64), p64(xda), p64(sums)],
        )
        .unwrap();
    let dt2 = t.elapsed().as_secs_f64();
    let got = to_f64(&d.download(sums, 8 * blocks));
    let total: f64 = got.iter().sum();
    assert_eq!(total, xd.iter().sum::<f64>());
    println!(
        "block_sum (bar.sync, shared), 2^20 elements: {} thread-instructions in {:.3} s = {:.3e} /s",
        st2.thread_instructions,
        dt2,
        st2.thread_instructions as f64 / dt2
    );
    // leangrad's relu_mask_fwd_f32 on a strided (transposed) 1024 x 1024 view:
    // 64-bit division and remainder per element, cvt through crate::numeric.
    let mut r = Dev::fixture("relu_mask_fwd_f32.ptx");
    let xa = r.upload(&f32s(&x));
    let y = r.zeros(4 * n);
    let mask = r.zeros(n / 8);
    let mut layout: Vec<i64> = vec![2, 0, 1024, 1024, 0, 0, 0, 0, 0, 0, 1, 1024];
    layout.resize(18, 0);
    let t = Instant::now();
    let st3 = r
        .launch(
            "relu_mask_fwd_f32",
            (n / 256) as u32,
            256,
            &[
                p64(0.5f64.to_bits()),
                p64(n as u64),
                p64(y),
                p64(mask),
                p64(xa),
                i64s(&layout),
            ],
        )
        .unwrap();
    let dt3 = t.elapsed().as_secs_f64();
    let gy = to_f32(&r.download(y, 4 * n));
    for i in (0..n).step_by(997) {
        let v = x[(i % 1024) * 1024 + i / 1024];
        assert_eq!(gy[i], if v > 0.0 { v } else { v * 0.5 }, "i={i}");
    }
    println!(
        "relu_mask_fwd_f32 (strided), 2^20 elements: {} thread-instructions in {:.3} s = {:.3e} /s",
        st3.thread_instructions,
        dt3,
        st3.thread_instructions as f64 / dt3
    );
    let all = (st.thread_instructions + st2.thread_instructions + st3.thread_instructions) as f64
        / (dt + dt2 + dt3);
    println!("overall: {all:.3e} thread-instructions/s");
    assert!(all > 1e6, "interpreter far too slow: {all:.3e}/s");
}
