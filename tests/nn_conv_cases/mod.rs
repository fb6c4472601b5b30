//! Configurations and naive f64 references for the convolution tests.
#![allow(dead_code)]

use leangrad::nn::{
    conv1d, conv2d, conv_transpose2d, Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions,
};
use leangrad::{DType, Device, Result, Tensor};

/// One test configuration: which op, its input/weight shapes and options.
#[derive(Clone, Copy)]
pub enum Op {
    Conv2d(Conv2dOptions),
    Conv1d(Conv1dOptions),
    ConvT(ConvTranspose2dOptions),
}

pub struct Case {
    pub name: &'static str,
    pub op: Op,
    pub x: &'static [usize],
    pub w: &'static [usize],
    pub bias: bool,
}

pub fn c2(stride: usize, padding: usize, dilation: usize, groups: usize) -> Op {
    Op::Conv2d(Conv2dOptions {
        stride: [stride, stride],
        padding: [padding, padding],
        dilation: [dilation, dilation],
        groups,
    })
}

pub fn cases() -> Vec<Case> {
    let asym = Op::Conv2d(Conv2dOptions {
        stride: [1, 2],
        padding: [1, 0],
        dilation: [2, 1],
        groups: 1,
    });
    let c1 = Op::Conv1d(Conv1dOptions {
        stride: 2,
        padding: 1,
        dilation: 2,
        groups: 2,
    });
    let t1 = Op::ConvT(ConvTranspose2dOptions {
        stride: [2, 2],
        padding: [1, 1],
        output_padding: [1, 1],
        dilation: [1, 1],
        groups: 2,
    });
    let t2 = Op::ConvT(ConvTranspose2dOptions {
        stride: [2, 1],
        padding: [1, 0],
        output_padding: [1, 1],
        dilation: [1, 2],
        groups: 1,
    });
    #[rustfmt::skip]
    let v = vec![
        Case { name: "plain", op: c2(1, 0, 1, 1), x: &[2, 3, 5, 5], w: &[4, 3, 3, 3], bias: true },
        Case { name: "stride 2 + padding", op: c2(2, 1, 1, 1), x: &[2, 3, 6, 5], w: &[4, 3, 3, 2], bias: true },
        Case { name: "dilation 2", op: c2(1, 2, 2, 1), x: &[1, 2, 5, 5], w: &[3, 2, 3, 3], bias: true },
        Case { name: "asymmetric", op: asym, x: &[1, 2, 6, 7], w: &[3, 2, 2, 3], bias: true },
        Case { name: "groups 2", op: c2(1, 1, 1, 2), x: &[2, 4, 4, 4], w: &[6, 2, 3, 3], bias: true },
        Case { name: "depthwise", op: c2(2, 1, 1, 3), x: &[2, 3, 5, 4], w: &[6, 1, 3, 3], bias: true },
        Case { name: "no bias", op: c2(1, 1, 1, 1), x: &[2, 2, 4, 3], w: &[3, 2, 2, 2], bias: false },
        Case { name: "conv1d", op: c1, x: &[2, 4, 9], w: &[6, 2, 3], bias: true },
        Case { name: "conv_transpose2d", op: t1, x: &[2, 4, 3, 3], w: &[4, 3, 3, 3], bias: true },
        Case { name: "conv_transpose2d dilated", op: t2, x: &[1, 2, 3, 2], w: &[2, 3, 2, 3], bias: false },
    ];
    v
}

/// Applies the case's op to `t = [x, w, (b)]`.
pub fn apply(op: Op, t: &[Tensor]) -> Result<Tensor> {
    let b = t.get(2);
    match op {
        Op::Conv2d(o) => conv2d(&t[0], &t[1], b, &o),
        Op::Conv1d(o) => conv1d(&t[0], &t[1], b, &o),
        Op::ConvT(o) => conv_transpose2d(&t[0], &t[1], b, &o),
    }
}

pub fn bias_len(c: &Case) -> usize {
    match c.op {
        Op::ConvT(o) => c.w[1] * o.groups,
        _ => c.w[0],
    }
}

pub fn inputs(c: &Case, dtype: DType) -> Vec<Tensor> {
    let t = |s: &[usize], seed| Tensor::rand_range(s, -1.0, 1.0, dtype, Device::Cpu, seed).unwrap();
    let mut v = vec![t(c.x, 1), t(c.w, 2)];
    if c.bias {
        v.push(t(&[bias_len(c)], 3));
    }
    v
}

/// Naive direct 2-d convolution over `[n, c, h, w]` in f64.
pub fn naive_conv(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    b: Option<&[f64]>,
    o: &Conv2dOptions,
) -> Vec<f64> {
    let ([n, c, h, wd], [oc, cig, kh, kw]) = (xs, ws);
    let oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
    let ow = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
    let cog = oc / o.groups;
    assert_eq!(cig * o.groups, c);
    let mut y = vec![0.0; n * oc * oh * ow];
    for i in 0..n {
        for co in 0..oc {
            let g = co / cog;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[co]);
                    for ci in 0..cig {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let iy = (oy * o.stride[0] + ki * o.dilation[0]) as isize
                                    - o.padding[0] as isize;
                                let ix = (ox * o.stride[1] + kj * o.dilation[1]) as isize
                                    - o.padding[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let xv = x
                                    [((i * c + g * cig + ci) * h + iy as usize) * wd + ix as usize];
                                acc += xv * w[((co * cig + ci) * kh + ki) * kw + kj];
                            }
                        }
                    }
                    y[((i * oc + co) * oh + oy) * ow + ox] = acc;
                }
            }
        }
    }
    y
}

/// Naive transposed convolution: every input element scatters `x · w` into
/// the output.
pub fn naive_conv_t(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    b: Option<&[f64]>,
    o: &ConvTranspose2dOptions,
) -> (Vec<f64>, [usize; 4]) {
    let ([n, c, h, wd], [_, cog, kh, kw]) = (xs, ws);
    let full = |a: usize, len: usize, k: usize| {
        (len - 1) * o.stride[a] + o.dilation[a] * (k - 1) + o.output_padding[a] + 1
            - 2 * o.padding[a]
    };
    let (oh, ow, oc, cig) = (
        full(0, h, kh),
        full(1, wd, kw),
        cog * o.groups,
        c / o.groups,
    );
    let mut y = vec![0.0; n * oc * oh * ow];
    for i in 0..n {
        for co in 0..oc {
            for p in 0..oh * ow {
                y[(i * oc + co) * oh * ow + p] = b.map_or(0.0, |b| b[co]);
            }
        }
        for ci in 0..c {
            let g = ci / cig;
            for iy in 0..h {
                for ix in 0..wd {
                    let xv = x[((i * c + ci) * h + iy) * wd + ix];
                    for col in 0..cog {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let oy = (iy * o.stride[0] + ki * o.dilation[0]) as isize
                                    - o.padding[0] as isize;
                                let ox = (ix * o.stride[1] + kj * o.dilation[1]) as isize
                                    - o.padding[1] as isize;
                                if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                    continue;
                                }
                                let co = g * cog + col;
                                y[((i * oc + co) * oh + oy as usize) * ow + ox as usize] +=
                                    xv * w[((ci * cog + col) * kh + ki) * kw + kj];
                            }
                        }
                    }
                }
            }
        }
    }
    (y, [n, oc, oh, ow])
}

/// The naive reference output and shape for a case.
pub fn reference(c: &Case, t: &[Tensor]) -> (Vec<f64>, Vec<usize>) {
    let x = t[0].to_f64_vec().unwrap();
    let w = t[1].to_f64_vec().unwrap();
    let b = t.get(2).map(|b| b.to_f64_vec().unwrap());
    let b = b.as_deref();
    let s4 = |s: &[usize]| [s[0], s[1], s[2], s[3]];
    match c.op {
        Op::Conv2d(o) => {
            let y = naive_conv(&x, s4(c.x), &w, s4(c.w), b, &o);
            let probe = naive_shape(c.x, c.w, &o);
            (y, probe)
        }
        Op::Conv1d(o) => {
            let o2 = Conv2dOptions {
                stride: [1, o.stride],
                padding: [0, o.padding],
                dilation: [1, o.dilation],
                groups: o.groups,
            };
            let (xs, ws) = ([c.x[0], c.x[1], 1, c.x[2]], [c.w[0], c.w[1], 1, c.w[2]]);
            let y = naive_conv(&x, xs, &w, ws, b, &o2);
            let s = naive_shape(&xs, &ws, &o2);
            (y, vec![s[0], s[1], s[3]])
        }
        Op::ConvT(o) => {
            let (y, s) = naive_conv_t(&x, s4(c.x), &w, s4(c.w), b, &o);
            (y, s.to_vec())
        }
    }
}

pub fn naive_shape(x: &[usize], w: &[usize], o: &Conv2dOptions) -> Vec<usize> {
    let out = |a: usize| {
        (x[2 + a] + 2 * o.padding[a] - o.dilation[a] * (w[2 + a] - 1) - 1) / o.stride[a] + 1
    };
    vec![x[0], w[0], out(0), out(1)]
}
