//! Execution of the tensor-core instructions `mma.sync.aligned` and
//! `ldmatrix.sync.aligned`, with fragments laid out exactly as the PTX
//! ISA's "Matrix Fragments for mma.m16n8kK" and ldmatrix sections give
//! them (`g = lane >> 2`, `t = lane % 4`).
//!
//! Both are `.aligned`: all 32 lanes of the warp must execute them
//! together; an absent, exited or divergent lane is a
//! [`FaultKind::DivergentBarrier`], as for a divergent barrier.
//!
//! Arithmetic of `mma` (the ISA leaves the accumulation's order and
//! rounding open): each element of D is C's element plus the K products
//! in k order, every product exact and the sum kept in f64, rounded once
//! to D's type (to nearest even); a NaN result is the canonical NaN.
//! `.tf32` operands are f32 registers whose low 13 mantissa bits are
//! ignored (truncated), as the tensor cores read them.

use super::exec::{Exec, Warp};
use super::ir::*;
use super::{Fault, FaultKind, SHARED_WIN};
use crate::numeric::{self, CvtMode, CvtTy, FloatTy, Rnd};

impl Exec<'_> {
    /// `mma` or `ldmatrix` executed by the lanes of `m`.
    pub(crate) fn mma_op(&mut self, w: &mut Warp, op: &Op, m: u32, pc: u32) -> Result<(), Fault> {
        if m == 0 {
            return Ok(());
        }
        match op {
            Op::Mma(x) => {
                self.all_lanes(w, m, pc, "mma.sync.aligned")?;
                mma(w, x);
                Ok(())
            }
            Op::Ldmatrix(x) => {
                self.all_lanes(w, m, pc, "ldmatrix.sync.aligned")?;
                self.ldmatrix(w, x, pc)
            }
            _ => Ok(()),
        }
    }

    /// synccheck of an `.aligned` warp instruction: all 32 lanes execute it.
    fn all_lanes(&self, w: &Warp, m: u32, pc: u32, what: &str) -> Result<(), Fault> {
        if m == !0 {
            return Ok(());
        }
        let missing = !m;
        let why = if missing & !w.valid != 0 {
            format!(
                "lanes {:#010x} do not exist (the block's last warp is partial)",
                missing & !w.valid
            )
        } else if missing & w.exited != 0 {
            format!("lanes {:#010x} have exited", missing & w.exited)
        } else {
            format!("lanes {missing:#010x} are not converged with them (divergent code)")
        };
        let detail = format!(
            "{what} executed by lanes {m:#010x} of warp {}: all 32 lanes must execute it \
             together, but {why}",
            w.id
        );
        let first = m.trailing_zeros();
        Err(self.fault(FaultKind::DivergentBarrier, w.id, first, pc, None, detail))
    }

    /// `ldmatrix`: lane `8j + r` supplies the address of row `r` of matrix
    /// `j`; the rows are loaded as ordinary 16-byte shared loads of those
    /// lanes (bounds, alignment, initcheck, racecheck), then distributed:
    /// lane `l` receives row `l / 4`, columns `2(l % 4)` and `2(l % 4) + 1`
    /// (low half first), or with `.trans` column `l / 4`, rows `2(l % 4)`
    /// and `2(l % 4) + 1`.
    fn ldmatrix(&mut self, w: &mut Warp, x: &Ldmatrix, pc: u32) -> Result<(), Fault> {
        let n = x.num as usize;
        let supply = if n == 4 { !0u32 } else { (1u32 << (8 * n)) - 1 };
        if x.space == Space::Generic {
            for l in 0..8 * n {
                let a = match x.addr.base {
                    Base::Reg(s) => w.regs[(w.reg_base + s as usize) * 32 + l],
                    _ => 0,
                }
                .wrapping_add(x.addr.off);
                if a >> 56 != SHARED_WIN >> 56 {
                    let detail = format!(
                        "ldmatrix: lane {l}'s generic row address {a:#x} is not in shared memory"
                    );
                    let kind = FaultKind::OutOfBounds;
                    return Err(self.fault(kind, w.id, l as u32, pc, Some(a), detail));
                }
            }
        }
        let ld = Op::Ld {
            space: x.space,
            size: 4,
            n: 4,
            sext_bits: 0,
            d: x.rows,
            addr: x.addr,
        };
        self.mem_op(w, &ld, supply, pc)?;
        let rb = w.reg_base * 32;
        // rows[8j + r][c]: element c of row r of matrix j.
        let mut rows = [[0u16; 8]; 32];
        for (l, row) in rows.iter_mut().enumerate().take(8 * n) {
            for (q, &s) in x.rows.iter().enumerate() {
                let v = w.regs[rb + s as usize * 32 + l] as u32;
                row[2 * q] = v as u16;
                row[2 * q + 1] = (v >> 16) as u16;
            }
        }
        for j in 0..n {
            let di = rb + x.d[j] as usize * 32;
            for l in 0..32 {
                let (g, t) = (l / 4, 2 * (l % 4));
                let (lo, hi) = if x.trans {
                    (rows[8 * j + t][g], rows[8 * j + t + 1][g])
                } else {
                    (rows[8 * j + g][t], rows[8 * j + g][t + 1])
                };
                w.regs[di + l] = lo as u64 | (hi as u64) << 16;
            }
        }
        Ok(())
    }
}

/// Row and column of element `i` of lane `l`'s A fragment.
fn a_pos(elem: MmaElem, k: u8, l: usize, i: usize) -> (usize, usize) {
    let (g, t) = (l >> 2, l & 3);
    match (elem, k) {
        (MmaElem::Tf32, 4) => (g + 8 * i, t),
        (MmaElem::Tf32, _) => (g + 8 * (i % 2), t + 4 * (i / 2)),
        (_, 8) => (g + 8 * (i / 2), 2 * t + (i & 1)),
        _ => (g + 8 * ((i / 2) % 2), 2 * t + (i & 1) + 8 * (i / 4)),
    }
}

/// Row (k) of element `i` of lane `l`'s B fragment; its column is `l >> 2`.
fn b_row(elem: MmaElem, k: u8, l: usize, i: usize) -> usize {
    let t = l & 3;
    match (elem, k) {
        (MmaElem::Tf32, 4) => t,
        (MmaElem::Tf32, _) => t + 4 * i,
        (_, 8) => 2 * t + i,
        _ => 2 * t + (i & 1) + 8 * (i / 2),
    }
}

/// Row and column of element `i` of lane `l`'s C or D fragment.
fn c_pos(l: usize, i: usize) -> (usize, usize) {
    ((l >> 2) + 8 * (i / 2), 2 * (l & 3) + (i & 1))
}

/// Element `i` of a fragment held in registers `regs` of lane `l`: one
/// per register for `.tf32`/`.f32` (`tf32`: low 13 bits cleared), two
/// halves per register (low first) otherwise.
fn elem_of(r: &[u64], regs: &[Slot], l: usize, i: usize, ty: Option<MmaElem>) -> f64 {
    let wide = |t: FloatTy, h: u64| {
        let f = numeric::cvt(
            CvtTy::Float(FloatTy::F64),
            CvtTy::Float(t),
            CvtMode::default(),
            h,
        );
        f64::from_bits(f)
    };
    match ty {
        None => f32::from_bits(r[regs[i] as usize * 32 + l] as u32) as f64,
        Some(MmaElem::Tf32) => f32::from_bits(r[regs[i] as usize * 32 + l] as u32 & !0x1fff) as f64,
        Some(h) => {
            let v = r[regs[i / 2] as usize * 32 + l] >> (16 * (i % 2)) & 0xffff;
            wide(
                if h == MmaElem::F16 {
                    FloatTy::F16
                } else {
                    FloatTy::Bf16
                },
                v,
            )
        }
    }
}

/// `mma.sync.aligned.m16n8kK.row.col`: D = A·B + C over the warp.
fn mma(w: &mut Warp, x: &Mma) {
    let (k, e) = (x.k as usize, x.elem);
    let half = |f16: bool| if f16 { Some(MmaElem::F16) } else { None };
    let (na, nb) = (16 * k / 32, 8 * k / 32);
    let mut a = [[0f64; 16]; 16];
    let mut b = [[0f64; 8]; 16];
    let mut c = [[0f64; 8]; 16];
    let r = &w.regs[w.reg_base * 32..];
    for l in 0..32 {
        for i in 0..na {
            let (row, col) = a_pos(e, x.k, l, i);
            a[row][col] = elem_of(r, &x.a, l, i, Some(e));
        }
        for i in 0..nb {
            b[b_row(e, x.k, l, i)][l >> 2] = elem_of(r, &x.b, l, i, Some(e));
        }
        for i in 0..4 {
            let (row, col) = c_pos(l, i);
            c[row][col] = elem_of(r, &x.c, l, i, half(x.c_f16));
        }
    }
    let mut d = [[0u32; 8]; 16];
    for i in 0..16 {
        for j in 0..8 {
            let mut acc = c[i][j];
            for kk in 0..k {
                acc += a[i][kk] * b[kk][j];
            }
            d[i][j] = round_acc(acc, x.d_f16);
        }
    }
    let rb = w.reg_base * 32;
    for l in 0..32 {
        if x.d_f16 {
            for q in 0..2 {
                let (row, col) = c_pos(l, 2 * q);
                let v = d[row][col] | d[row][col + 1] << 16;
                w.regs[rb + x.d[q] as usize * 32 + l] = v as u64;
            }
        } else {
            for i in 0..4 {
                let (row, col) = c_pos(l, i);
                w.regs[rb + x.d[i] as usize * 32 + l] = d[row][col] as u64;
            }
        }
    }
}

/// The f64 sum rounded once to f32 (or f16) bits, to nearest even; NaN
/// canonical.
fn round_acc(acc: f64, f16: bool) -> u32 {
    if acc.is_nan() {
        return if f16 { 0x7fff } else { 0x7fff_ffff };
    }
    if f16 {
        let mode = CvtMode {
            rnd: Some(Rnd::Rn),
            ..CvtMode::default()
        };
        let f = CvtTy::Float;
        numeric::cvt(f(FloatTy::F16), f(FloatTy::F64), mode, acc.to_bits()) as u32
    } else {
        (acc as f32).to_bits()
    }
}
