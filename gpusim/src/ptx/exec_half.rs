//! Execution of packed half-pair arithmetic and comparisons: the scalar
//! operation of [`crate::numeric`] on each 16-bit half, so a pair rounds,
//! flushes and saturates exactly as two scalar f16/bf16 instructions.

use super::alu::lanes;
use super::exec::Warp;
use super::ir::*;
use crate::numeric::{self, FloatTy};

/// `f` on the low and the high half of `v`.
#[inline(always)]
fn halves(v: [u64; 3], mut f: impl FnMut(u64, u64, u64) -> u64) -> u64 {
    let lo = f(v[0] & 0xffff, v[1] & 0xffff, v[2] & 0xffff) & 0xffff;
    let hi = f(
        v[0] >> 16 & 0xffff,
        v[1] >> 16 & 0xffff,
        v[2] >> 16 & 0xffff,
    ) & 0xffff;
    hi << 16 | lo
}

/// One half of a packed operation.
#[inline(always)]
fn packed_half(op: PackedOp, ty: FloatTy, ftz: bool, sat: bool, x: u64, y: u64, z: u64) -> u64 {
    match op {
        PackedOp::Add(r) => numeric::fadd(ty, x, y, r, ftz, sat),
        PackedOp::Sub(r) => numeric::fsub(ty, x, y, r, ftz, sat),
        PackedOp::Mul(r) => numeric::fmul(ty, x, y, r, ftz, sat),
        PackedOp::Fma { rnd, relu } => {
            let v = numeric::ffma(ty, x, y, z, rnd, ftz, sat);
            let nan = v & 0x7fff > if ty == FloatTy::F16 { 0x7c00 } else { 0x7f80 };
            match (relu, nan) {
                // .relu: NaN becomes the canonical NaN, negatives +0.
                (true, true) => 0x7fff,
                (true, false) if v & 0x8000 != 0 => 0,
                _ => v,
            }
        }
        PackedOp::Neg => numeric::fneg(ty, x, ftz),
        PackedOp::Abs => numeric::fabs(ty, x, ftz),
        PackedOp::Min { nan } => numeric::fminmax(ty, x, y, false, ftz, nan),
        PackedOp::Max { nan } => numeric::fminmax(ty, x, y, true, ftz, nan),
    }
}

/// Executes an [`Op::Packed`] or [`Op::CmpPair`] for the lanes of `m`.
pub(crate) fn half_pair_op(w: &mut Warp, op: &Op, m: u32) {
    let r = &mut w.regs[w.reg_base * 32..];
    match *op {
        Op::Packed {
            op,
            ty,
            ftz,
            sat,
            d,
            a,
            b,
            c,
        } => {
            let (av, bv, cv) = (lanes(r, a), lanes(r, b), lanes(r, c));
            let i = d as usize * 32;
            for l in 0..32 {
                if m >> l & 1 != 0 {
                    r[i + l] = halves([av[l], bv[l], cv[l]], |x, y, z| {
                        packed_half(op, ty, ftz, sat, x, y, z)
                    });
                }
            }
        }
        Op::CmpPair {
            op,
            ty,
            ftz,
            one,
            d,
            p,
            q,
            a,
            b,
        } => {
            let (av, bv) = (lanes(r, a), lanes(r, b));
            let (mut lo_bits, mut hi_bits) = (0u32, 0u32);
            for l in 0..32 {
                if m >> l & 1 == 0 {
                    continue;
                }
                let lo = numeric::fcmp(ty, op, av[l] & 0xffff, bv[l] & 0xffff, ftz);
                let hi = numeric::fcmp(ty, op, av[l] >> 16 & 0xffff, bv[l] >> 16 & 0xffff, ftz);
                lo_bits |= (lo as u32) << l;
                hi_bits |= (hi as u32) << l;
                if d != SINK {
                    let h = |t: bool| if t { one as u64 } else { 0 };
                    r[d as usize * 32 + l] = h(hi) << 16 | h(lo);
                }
            }
            for (s, v) in [(p, lo_bits), (q, hi_bits)] {
                if s != NO_PRED {
                    let x = &mut w.preds[w.pred_base + s as usize];
                    *x = (*x & !m) | (v & m);
                }
            }
        }
        _ => {}
    }
}
