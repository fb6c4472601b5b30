//! MultiheadAttention: parameters and init, equality with a hand
//! composition linear → SDPA → linear, gradcheck, policies with exact bytes.

mod common;

use common::{assert_close, check, check_policies, rand64};
use leangrad::nn::{
    scaled_dot_product_attention as sdpa, MhaOptions, Module, MultiheadAttention, SdpaOptions,
};
use leangrad::{DType, Device, Tensor};

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

fn mha(e: usize, h: usize, p: f64, bias: bool) -> MultiheadAttention {
    MultiheadAttention::builder(e, h)
        .name("mha")
        .dropout(p)
        .bias(bias)
        .dtype(DType::F64)
        .seed(42)
        .build(&Device::Cpu)
        .unwrap()
}

#[test]
fn mha_parameters() {
    let m = mha(8, 2, 0.0, true);
    let ps: Vec<(String, Vec<usize>)> = m
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec()))
        .collect();
    let want: Vec<(String, Vec<usize>)> = vec![
        ("in_proj_weight".into(), vec![24, 8]),
        ("in_proj_bias".into(), vec![24]),
        ("out_proj.weight".into(), vec![8, 8]),
        ("out_proj.bias".into(), vec![8]),
    ];
    assert_eq!(ps, want);
    let bound = (6.0f64 / 32.0).sqrt();
    assert!(vals(&m.in_proj_weight).iter().all(|x| x.abs() < bound));
    assert!(vals(m.in_proj_bias.as_ref().unwrap())
        .iter()
        .all(|&x| x == 0.0));
    assert!(vals(m.out_proj.bias.as_ref().unwrap())
        .iter()
        .all(|&x| x == 0.0));
    let wb = 1.0 / 8f64.sqrt();
    assert!(vals(&m.out_proj.weight).iter().all(|x| x.abs() < wb));
    assert_eq!(mha(8, 2, 0.0, false).named_parameters().len(), 2);
}

/// Linear → SDPA → linear by hand.
fn by_hand(m: &MultiheadAttention, x: [&Tensor; 3], causal: bool) -> Tensor {
    by_hand_opts(m, x, SdpaOptions::default().causal(causal))
}

fn by_hand_opts(m: &MultiheadAttention, x: [&Tensor; 3], so: SdpaOptions) -> Tensor {
    let (e, h) = (m.in_proj_weight.shape()[1], m.num_heads());
    let proj = |t: &Tensor, i: usize| {
        let w = m.in_proj_weight.narrow(0, i * e, e).unwrap();
        let b = m
            .in_proj_bias
            .as_ref()
            .unwrap()
            .narrow(0, i * e, e)
            .unwrap();
        let y = t.matmul(&w.t().unwrap()).unwrap().add(&b).unwrap();
        let (bs, l) = (t.shape()[0], t.shape()[1]);
        y.reshape(&[bs, l, h, e / h])
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap()
    };
    let o = sdpa(&proj(x[0], 0), &proj(x[1], 1), &proj(x[2], 2), &so).unwrap();
    let (bs, lq) = (x[0].shape()[0], x[0].shape()[1]);
    let o = o
        .permute(&[0, 2, 1, 3])
        .unwrap()
        .reshape(&[bs, lq, e])
        .unwrap();
    m.out_proj.forward(&o).unwrap()
}

#[test]
fn mha_matches_hand_composition() {
    let mut m = mha(6, 3, 0.0, true);
    m.in_proj_bias = Some(rand64(&[18], 50));
    m.out_proj.bias = Some(rand64(&[6], 51));
    let x = rand64(&[2, 4, 6], 52);
    let y = rand64(&[2, 5, 6], 53);
    let z = rand64(&[2, 5, 6], 54);
    let selfo = m.forward(&x).unwrap();
    assert_close(
        &vals(&selfo),
        &vals(&by_hand(&m, [&x, &x, &x], false)),
        1e-12,
    );
    let c = m
        .attention(
            &x,
            &x,
            &x,
            &MhaOptions {
                causal: true,
                attn_mask: None,
            },
        )
        .unwrap();
    assert_close(&vals(&c), &vals(&by_hand(&m, [&x, &x, &x], true)), 1e-12);
    // masks: float [Lq, Lk], and a U8 one given as [B·H, Lq, Lk]
    let am = rand64(&[4, 5], 55);
    let mo = MhaOptions {
        causal: false,
        attn_mask: Some(am.clone()),
    };
    let got = m.attention(&x, &y, &z, &mo).unwrap();
    let want = by_hand_opts(&m, [&x, &y, &z], SdpaOptions::default().mask(am));
    assert_close(&vals(&got), &vals(&want), 1e-12);
    let bits: Vec<u8> = (0..2 * 3 * 4 * 5).map(|i| u8::from(i % 4 != 3)).collect();
    let bm = Tensor::from_vec(bits.clone(), &[6, 4, 5], Device::Cpu).unwrap();
    let bm4 = Tensor::from_vec(bits, &[2, 3, 4, 5], Device::Cpu).unwrap();
    let mo = MhaOptions {
        causal: true,
        attn_mask: Some(bm),
    };
    let got = m.attention(&x, &y, &z, &mo).unwrap();
    let so = SdpaOptions::default().mask(bm4).causal(true);
    assert_close(
        &vals(&got),
        &vals(&by_hand_opts(&m, [&x, &y, &z], so)),
        1e-12,
    );
    let cross = m.attention(&x, &y, &z, &MhaOptions::default()).unwrap();
    assert_eq!(cross.shape(), &[2, 4, 6]);
    assert_close(
        &vals(&cross),
        &vals(&by_hand(&m, [&x, &y, &z], false)),
        1e-12,
    );
}

#[test]
fn mha_gradcheck_and_param_grads() {
    let mut m = mha(4, 2, 0.0, true);
    m.in_proj_bias = Some(rand64(&[12], 60).into_parameter().unwrap());
    let x = rand64(&[1, 3, 4], 61);
    let y = rand64(&[1, 2, 4], 62);
    check(
        |t| m.attention(&t[0], &t[1], &t[1], &MhaOptions::default()),
        &[x.clone(), y.clone()],
    );
    check(
        |t| {
            m.attention(
                &t[0],
                &t[0],
                &t[0],
                &MhaOptions {
                    causal: true,
                    attn_mask: None,
                },
            )
        },
        std::slice::from_ref(&x),
    );
    let mut md = mha(4, 2, 0.5, true);
    md.set_training(true);
    let o = md.forward(&x).unwrap();
    o.sum_all().unwrap().backward().unwrap();
    for (name, p) in md.named_parameters() {
        assert!(p.grad().is_some(), "{name} has no gradient");
    }
}

/// Self-attention `[B, L, E]` with H heads; the module is built inside
/// each run (its dropout generator then starts afresh, and its parameters
/// are model state, never counted as saved). Lean keeps x (for
/// in_proj_weight's grad), the `[B, L, 3E]` projection once (Q, K, V are
/// views of it), `lse` (B·H·L) instead of P (B·H·L·L) and the attention
/// output `[B, L, E]` (for out_proj.weight's grad). SaveAll keeps P as
/// well as `lse` (both policies run the fused kernels, which read `lse`),
/// and a u8 dropout mask when p > 0.
#[test]
fn mha_policies_exact_bytes() {
    let (b, l, e, h) = (2, 5, 4, 2);
    for p in [0.0, 0.5] {
        for causal in [false, true] {
            let o = MhaOptions {
                causal,
                attn_mask: None,
            };
            let f = |t: &[Tensor]| {
                let m = MultiheadAttention::builder(e, h)
                    .name("mha")
                    .dropout(p)
                    .dtype(DType::F64)
                    .seed(7)
                    .build(&Device::Cpu)?;
                m.attention(&t[0], &t[0], &t[0], &o)
            };
            let rows = check_policies(&f, &[rand64(&[b, l, e], 70)]);
            let x = 8 * b * l * e;
            let acts = x + 3 * x + x;
            let p_bytes = 8 * b * h * l * l;
            let lse = 8 * b * h * l;
            let all = acts + p_bytes + lse + if p > 0.0 { b * h * l * l } else { 0 };
            for (combo, got_lean, got_all) in rows {
                let lean = acts + lse;
                assert_eq!(
                    (got_lean, got_all),
                    (lean, all),
                    "p {p} causal {causal} combo {combo}"
                );
            }
        }
    }
}
