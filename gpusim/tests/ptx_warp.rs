//! Warp-synchronous instructions (tests/cuda/warp.cu and hand-written
//! PTX): `shfl.sync` in every mode against host references of the CUDA API
//! and of the ISA's clamp/segment rules, `redux.sync`, `vote.sync`,
//! `match.sync`, `activemask`; and the synccheck faults of wrong uses
//! (tests/cuda/warp_broken.cu).
// Index loops mirror the kernels' lane indices, which reads clearer here.
#![allow(clippy::needless_range_loop)]

mod ptx_common;
use leangrad_gpusim::ptx::FaultKind;
use ptx_common::*;

fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The warp's shuffle tree of `warp_sum` in warp.cu, as f32 additions in
/// the kernel's order; lane 0's result.
fn warp_tree(v: &[f32]) -> f32 {
    let mut v = v.to_vec();
    let mut o = 16;
    while o > 0 {
        let old = v.clone();
        for l in 0..32 {
            v[l] = old[l] + if l + o < 32 { old[l + o] } else { old[l] };
        }
        o >>= 1;
    }
    v[0]
}

#[test]
fn block_reduction_with_warp_shuffles() {
    let mut d = Dev::fixture("warp.ptx");
    let n = 1000usize;
    let mut rng = Rng(7);
    let x: Vec<f32> = (0..n).map(|_| rng.unit() as f32).collect();
    let xa = d.upload(&f32s(&x));
    let blocks = n.div_ceil(256);
    let out = d.zeros(4 * blocks);
    d.launch(
        "block_reduce_sum",
        blocks as u32,
        256,
        &[p32(n as u32), p64(xa), p64(out)],
    )
    .unwrap();
    let got = to_f32(&d.download(out, 4 * blocks));
    for b in 0..blocks {
        let mut warp_sums = vec![0f32; 32];
        for w in 0..8 {
            let lanes: Vec<f32> = (0..32)
                .map(|l| x.get(b * 256 + w * 32 + l).copied().unwrap_or(0.0))
                .collect();
            warp_sums[w] = warp_tree(&lanes);
        }
        let want = warp_tree(&warp_sums);
        assert_eq!(got[b].to_bits(), want.to_bits(), "block {b}");
    }
}

/// The CUDA API's shuffles with `width`: (idx, up, down, xor) sources.
fn api_shfl(x: &[i32], t: usize, width: usize, delta: usize) -> [i32; 4] {
    let (lane, base) = (t % 32, t - t % 32);
    let seg = lane / width * width;
    let idx = x[base + seg + delta % width];
    let up = if lane % width >= delta {
        x[t - delta]
    } else {
        x[t]
    };
    let down = if lane % width + delta < width {
        x[t + delta]
    } else {
        x[t]
    };
    let src = lane ^ delta;
    let xor = if src <= (lane | (width - 1)) {
        x[base + src]
    } else {
        x[t]
    };
    [idx, up, down, xor]
}

#[test]
fn shuffle_modes_of_the_cuda_api_with_widths() {
    let mut d = Dev::fixture("warp.ptx");
    let x: Vec<i32> = (0..64).map(|i| i * 7 - 100).collect();
    let xa = d.upload(&i32s(&x));
    let out = d.zeros(4 * 4 * 64);
    for width in [32usize, 16, 8, 4, 2, 1] {
        for delta in [0usize, 1, 2, 3, 5, 15, 16, 31] {
            d.launch(
                "shfl_modes",
                1,
                64,
                &[p64(xa), p32(width as u32), p32(delta as u32), p64(out)],
            )
            .unwrap();
            let got = to_u32(&d.download(out, 4 * 4 * 64));
            for t in 0..64 {
                let want = api_shfl(&x, t, width, delta);
                let g: Vec<i32> = got[4 * t..4 * t + 4].iter().map(|&v| v as i32).collect();
                assert_eq!(g, want, "width {width} delta {delta} thread {t}");
            }
        }
    }
}

#[test]
fn f64_shuffles_and_warp_scan() {
    let mut d = Dev::fixture("warp.ptx");
    let x: Vec<f64> = (0..64).map(|i| i as f64 * 1.25 - 3.0).collect();
    let xa = d.upload(&f64s(&x));
    let out = d.zeros(8 * 64);
    d.launch("shfl_f64", 1, 64, &[p64(xa), p64(out)]).unwrap();
    let got = to_f64(&d.download(out, 8 * 64));
    for t in 0..64 {
        let w = t & !31;
        assert_eq!(got[t], x[t ^ 1] + x[w + 31 - (t & 31)], "thread {t}");
    }
    let xi: Vec<i32> = (0..96).map(|i| (i * 37 % 11) - 5).collect();
    let xa = d.upload(&i32s(&xi));
    let out = d.zeros(4 * 96);
    d.launch("warp_scan", 1, 96, &[p64(xa), p64(out)]).unwrap();
    let got = to_u32(&d.download(out, 4 * 96));
    for t in 0..96 {
        let want: i32 = xi[t & !31..=t].iter().sum();
        assert_eq!(got[t] as i32, want, "thread {t}");
    }
}

#[test]
fn redux_vote_match_and_activemask() {
    let mut d = Dev::fixture("warp.ptx");
    let mut rng = Rng(3);
    let mut x: Vec<u32> = (0..64).map(|_| rng.next() as u32 % 300).collect();
    x[5] = 0x8000_0001; // negative as s32
    x[40] = 0;
    for w in 32..64 {
        x[w] |= 1; // warp 1: every value odd
    }
    let xa = d.upload(&u32s(&x));
    let out = d.zeros(4 * 12 * 64);
    d.launch("redux_vote_match", 1, 64, &[p64(xa), p64(out)])
        .unwrap();
    let got = to_u32(&d.download(out, 4 * 12 * 64));
    for t in 0..64 {
        let g = &x[t & !31..(t & !31) + 32];
        let same = |f: &dyn Fn(u32) -> u32| {
            (0..32)
                .filter(|&k| f(g[k]) == f(x[t]))
                .fold(0u32, |s, k| s | 1 << k)
        };
        let all_same = g.iter().all(|&v| v & 1 == g[0] & 1);
        let want = [
            g.iter().fold(0u32, |s, &v| s.wrapping_add(v)),
            *g.iter().min().unwrap(),
            *g.iter().max().unwrap(),
            g.iter().map(|&v| v as i32).min().unwrap() as u32,
            g.iter().map(|&v| v as i32).max().unwrap() as u32,
            g.iter().fold(!0, |s, &v| s & v),
            g.iter().fold(0, |s, &v| s | v),
            g.iter().fold(0, |s, &v| s ^ v),
            same(&|v| v & 3),
            if all_same { !0 } else { 0 },
            all_same as u32
                | (g.iter().any(|&v| v > 100) as u32) << 1
                | (g.iter().all(|&v| v > 0) as u32) << 2
                | (all_same as u32) << 3,
            !0,
        ];
        assert_eq!(&got[12 * t..12 * t + 12], &want, "thread {t}");
    }
}

#[test]
fn half_warp_shuffles_with_sub_masks_in_divergent_code() {
    let mut d = Dev::fixture("warp.ptx");
    let x: Vec<i32> = (0..64).map(|i| i * i - 50).collect();
    let xa = d.upload(&i32s(&x));
    let out = d.zeros(4 * 64);
    d.launch("half_warp_sum", 1, 64, &[p64(xa), p64(out)])
        .unwrap();
    let got = to_u32(&d.download(out, 4 * 64));
    for t in 0..64 {
        let want: i32 = x[t & !15..(t & !15) + 16].iter().sum();
        assert_eq!(got[t] as i32, want, "thread {t}");
    }
}

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// A kernel running `shfl.sync.<mode>.b32 d|p, a, b, c, member` with
/// per-lane a, b, c from arrays; writes d and p per lane.
fn raw_shfl(mode: &str) -> String {
    format!(
        "{HEADER}.visible .entry k(.param .u64 x, .param .u64 out, .param .u32 member)\n{{\n\
         .reg .pred %p<2>;\n.reg .b32 %r<12>;\n.reg .b64 %rd<8>;\n\
         ld.param.u64 %rd1, [x];\nld.param.u64 %rd2, [out];\nld.param.u32 %r9, [member];\n\
         mov.u32 %r1, %tid.x;\nmul.wide.u32 %rd3, %r1, 12;\nadd.s64 %rd4, %rd1, %rd3;\n\
         ld.global.u32 %r2, [%rd4];\nld.global.u32 %r3, [%rd4+4];\nld.global.u32 %r4, [%rd4+8];\n\
         shfl.sync.{mode}.b32 %r5|%p1, %r2, %r3, %r4, %r9;\n\
         selp.u32 %r6, 1, 0, %p1;\nmul.wide.u32 %rd5, %r1, 8;\nadd.s64 %rd6, %rd2, %rd5;\n\
         st.global.v2.u32 [%rd6], {{%r5, %r6}};\nret;\n}}\n"
    )
}

/// The ISA's pseudo-code for lane `lane`: (source lane, in range).
fn isa_shfl(mode: &str, lane: i32, b: u32, c: u32) -> (usize, bool) {
    let bval = (b & 31) as i32;
    let cval = (c & 31) as i32;
    let seg = (c >> 8 & 31) as i32;
    let max_lane = (lane & seg) | (cval & !seg);
    let min_lane = lane & seg;
    let (j, p) = match mode {
        "up" => (lane - bval, lane - bval >= max_lane),
        "down" => (lane + bval, lane + bval <= max_lane),
        "bfly" => (lane ^ bval, lane ^ bval <= max_lane),
        _ => {
            let j = min_lane | (bval & !seg);
            (j, j <= max_lane)
        }
    };
    (if p { j as usize } else { lane as usize }, p)
}

#[test]
fn raw_shuffles_follow_the_isa_clamp_and_segment_rules() {
    let mut rng = Rng(11);
    for mode in ["up", "down", "bfly", "idx"] {
        let mut d = Dev::text(&raw_shfl(mode));
        for trial in 0..40 {
            // Random b (with bits above 4 set: they are ignored) and
            // random clamp/segment c, shared or per lane.
            let shared_c = trial % 2 == 0;
            let c0 = (rng.next() as u32) & 0x1f1f;
            let mut x = Vec::new();
            let mut abc = Vec::new();
            for l in 0..32u32 {
                let a = rng.next() as u32;
                let b = rng.next() as u32 & if trial < 20 { 0x3f } else { 0x7 };
                let c = if shared_c {
                    c0
                } else {
                    rng.next() as u32 & 0x1f1f
                };
                x.extend([a, b, c]);
                abc.push((a, b, c));
                let _ = l;
            }
            let xa = d.upload(&u32s(&x));
            let out = d.zeros(8 * 32);
            d.launch("k", 1, 32, &[p64(xa), p64(out), p32(!0)]).unwrap();
            let got = to_u32(&d.download(out, 8 * 32));
            for l in 0..32 {
                let (a, b, c) = abc[l];
                let _ = a;
                let (j, p) = isa_shfl(mode, l as i32, b, c);
                assert_eq!(
                    (got[2 * l], got[2 * l + 1]),
                    (abc[j].0, p as u32),
                    "{mode} trial {trial} lane {l} b {b:#x} c {c:#x}"
                );
            }
        }
    }
}

#[test]
fn shuffle_faults_name_the_lanes() {
    let mut d = Dev::fixture("warp_broken.ptx");
    let x = d.upload(&i32s(&(0..64).collect::<Vec<i32>>()));
    let out = d.zeros(4 * 64);
    let f = d
        .launch("shfl_divergent", 1, 32, &[p64(x), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::DivergentBarrier);
    let msg = f.to_string();
    assert!(
        msg.contains("shfl.sync") && msg.contains("not converged"),
        "{msg}"
    );
    let f = d
        .launch("shfl_exited", 1, 32, &[p32(20), p64(x), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::DivergentBarrier);
    assert_eq!(f.thread, [16, 0, 0]);
    assert!(
        f.to_string()
            .contains("reads source lane 20, which has exited"),
        "{f}"
    );
    d.launch("shfl_exited", 1, 32, &[p32(32), p64(x), p64(out)])
        .unwrap();
    let f = d
        .launch("shfl_not_member", 1, 32, &[p64(x), p64(out)])
        .unwrap_err();
    assert_eq!(f.thread, [16, 0, 0]);
    assert!(f.to_string().contains("does not include itself"), "{f}");
    let f = d
        .launch("shfl_non_member_source", 1, 32, &[p64(x), p64(out)])
        .unwrap_err();
    assert!(
        f.to_string()
            .contains("source lane 20, which is not in the member mask"),
        "{f}"
    );
    let f = d
        .launch("redux_divergent", 1, 32, &[p64(x), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::DivergentBarrier);
    assert!(f.to_string().contains("redux.sync"), "{f}");
}

#[test]
fn warp_reduction_in_a_partial_warp_reads_missing_lanes() {
    // 48 threads: warp 1 has 16 lanes, and its shuffle tree reads lane 16.
    let mut d = Dev::fixture("warp.ptx");
    let x = d.upload(&f32s(&[1.0; 48]));
    let out = d.zeros(4);
    let f = d
        .launch("block_reduce_sum", 1, 48, &[p32(48), p64(x), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::DivergentBarrier);
    assert_eq!(f.thread, [32, 0, 0]);
    assert!(f.to_string().contains("does not exist"), "{f}");
}

#[test]
fn syncwarp_orders_shared_accesses_of_the_warp() {
    let mut d = Dev::fixture("warp.ptx");
    let x: Vec<i32> = (0..64).map(|i| 3 * i + 1).collect();
    let xa = d.upload(&i32s(&x));
    let out = d.zeros(4 * 64);
    d.launch("syncwarp_exchange", 1, 64, &[p64(xa), p64(out)])
        .unwrap();
    let got = to_u32(&d.download(out, 4 * 64));
    for t in 0..64 {
        assert_eq!(got[t] as i32, x[t ^ 1], "thread {t}");
    }
    let mut b = Dev::fixture("warp_broken.ptx");
    let xa = b.upload(&i32s(&x));
    let out = b.zeros(4 * 64);
    let f = b
        .launch("exchange_without_syncwarp", 1, 64, &[p64(xa), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::SharedRace);
    let f = b
        .launch("syncwarp_divergent", 1, 32, &[p64(xa), p64(out)])
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::DivergentBarrier);
    assert!(f.to_string().contains("bar.warp.sync"), "{f}");
}
