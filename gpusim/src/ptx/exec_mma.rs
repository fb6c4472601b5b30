//! Execution of the tensor-core instructions `mma.sync.aligned`,
//! `ldmatrix.sync.aligned` and `stmatrix.sync.aligned`, with fragments laid
//! out exactly as the PTX ISA's "Matrix Fragments for mma.m16n8kK" and
//! ldmatrix/stmatrix sections give them (`g = lane >> 2`, `t = lane % 4`).
//!
//! All are `.aligned`: all 32 lanes of the warp must execute them
//! together; an absent, exited or divergent lane is a
//! [`FaultKind::DivergentBarrier`], as for a divergent barrier.
//!
//! Arithmetic of `mma` (the ISA leaves the accumulation's order and
//! rounding open): each element of D is C's element plus the K products
//! in k order, every product exact and the sum kept in f64, rounded once
//! to D's type (to nearest even); a NaN result is the canonical NaN.
//! Integer sums are exact; the s32 result wraps, or with `.satfinite`
//! is clamped to the s32 range.
//! `.tf32` operands are f32 registers whose low 13 mantissa bits are
//! ignored (truncated), as the tensor cores read them.

use super::exec::{Exec, Warp};
use super::ir::*;
use super::{Fault, FaultKind, SHARED_WIN};
use crate::numeric::{self, CvtMode, CvtTy, FloatTy, Rnd};

impl Exec<'_> {
    /// `mma`, `ldmatrix` or `stmatrix` executed by the lanes of `m`.
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
            Op::Stmatrix(x) => {
                self.all_lanes(w, m, pc, "stmatrix.sync.aligned")?;
                self.stmatrix(w, x, pc)
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

    /// The lanes that supply row addresses (`8·num`); with a generic
    /// address, each must point into shared memory.
    fn row_lanes(&self, w: &Warp, x: &Matrix8x8, pc: u32, what: &str) -> Result<u32, Fault> {
        let n = x.num as usize;
        if x.space == Space::Generic {
            for l in 0..8 * n {
                let a = match x.addr.base {
                    Base::Reg(s) => w.regs[(w.reg_base + s as usize) * 32 + l],
                    _ => 0,
                }
                .wrapping_add(x.addr.off);
                if a >> 56 != SHARED_WIN >> 56 {
                    let detail = format!(
                        "{what}: lane {l}'s generic row address {a:#x} is not in shared memory"
                    );
                    let kind = FaultKind::OutOfBounds;
                    return Err(self.fault(kind, w.id, l as u32, pc, Some(a), detail));
                }
            }
        }
        Ok(if n == 4 { !0u32 } else { (1u32 << (8 * n)) - 1 })
    }

    /// `ldmatrix`: lane `8j + r` supplies the address of row `r` of matrix
    /// `j`; the rows are loaded as ordinary 16-byte shared loads of those
    /// lanes (bounds, alignment, initcheck, racecheck), then distributed:
    /// lane `l` receives row `l / 4`, columns `2(l % 4)` and `2(l % 4) + 1`
    /// (low half first), or with `.trans` column `l / 4`, rows `2(l % 4)`
    /// and `2(l % 4) + 1`.
    fn ldmatrix(&mut self, w: &mut Warp, x: &Matrix8x8, pc: u32) -> Result<(), Fault> {
        let supply = self.row_lanes(w, x, pc, "ldmatrix")?;
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
        for (l, row) in rows.iter_mut().enumerate().take(8 * x.num as usize) {
            for (q, &s) in x.rows.iter().enumerate() {
                let v = w.regs[rb + s as usize * 32 + l] as u32;
                row[2 * q] = v as u16;
                row[2 * q + 1] = (v >> 16) as u16;
            }
        }
        for j in 0..x.num as usize {
            let di = rb + x.d[j] as usize * 32;
            for l in 0..32 {
                let [(r0, c0), (r1, c1)] = frag_cells(l, x.trans);
                w.regs[di + l] = rows[8 * j + r0][c0] as u64 | (rows[8 * j + r1][c1] as u64) << 16;
            }
        }
        Ok(())
    }

    /// `stmatrix` (the inverse of `ldmatrix`): each lane's fragment goes to
    /// its cells of the matrices, then lane `8j + r` stores row `r` of
    /// matrix `j` as an ordinary 16-byte shared store.
    fn stmatrix(&mut self, w: &mut Warp, x: &Matrix8x8, pc: u32) -> Result<(), Fault> {
        let supply = self.row_lanes(w, x, pc, "stmatrix")?;
        let rb = w.reg_base * 32;
        let mut rows = [[0u16; 8]; 32];
        for j in 0..x.num as usize {
            for l in 0..32 {
                let v = w.regs[rb + x.d[j] as usize * 32 + l] as u32;
                let [(r0, c0), (r1, c1)] = frag_cells(l, x.trans);
                rows[8 * j + r0][c0] = v as u16;
                rows[8 * j + r1][c1] = (v >> 16) as u16;
            }
        }
        for (l, row) in rows.iter().enumerate().take(8 * x.num as usize) {
            for (q, &s) in x.rows.iter().enumerate() {
                let v = row[2 * q] as u32 | (row[2 * q + 1] as u32) << 16;
                w.regs[rb + s as usize * 32 + l] = v as u64;
            }
        }
        let st = Op::St {
            space: x.space,
            size: 4,
            n: 4,
            s: x.rows,
            addr: x.addr,
        };
        self.mem_op(w, &st, supply, pc)
    }
}

/// The (row, column) cells of an 8×8 b16 matrix that lane `l`'s register
/// holds (low half first): row `l / 4`, columns `2(l % 4)` and the next,
/// or transposed.
fn frag_cells(l: usize, trans: bool) -> [(usize, usize); 2] {
    let (g, t) = (l / 4, 2 * (l % 4));
    if trans {
        [(t, g), (t + 1, g)]
    } else {
        [(g, t), (g, t + 1)]
    }
}

/// Row and column of element `i` of lane `l`'s A fragment.
fn a_pos(elem: MmaElem, k: u8, l: usize, i: usize) -> (usize, usize) {
    let (g, t) = (l >> 2, l & 3);
    match (elem.per_reg(), k) {
        (1, 4) => (g + 8 * i, t),
        (1, _) => (g + 8 * (i % 2), t + 4 * (i / 2)),
        (2, 8) => (g + 8 * (i / 2), 2 * t + (i & 1)),
        (2, _) => (g + 8 * ((i / 2) % 2), 2 * t + (i & 1) + 8 * (i / 4)),
        (_, 16) => (g + 8 * (i / 4), 4 * t + (i & 3)),
        _ => (g + 8 * ((i / 4) % 2), 4 * t + (i & 3) + 16 * (i / 8)),
    }
}

/// Row (k) of element `i` of lane `l`'s B fragment; its column is `l >> 2`.
fn b_row(elem: MmaElem, k: u8, l: usize, i: usize) -> usize {
    let t = l & 3;
    match (elem.per_reg(), k) {
        (1, 4) => t,
        (1, _) => t + 4 * i,
        (2, 8) => 2 * t + i,
        (2, _) => 2 * t + (i & 1) + 8 * (i / 2),
        (_, 16) => 4 * t + i,
        _ => 4 * t + (i & 3) + 16 * (i / 4),
    }
}

/// Row and column of element `i` of lane `l`'s C or D fragment.
fn c_pos(l: usize, i: usize) -> (usize, usize) {
    ((l >> 2) + 8 * (i / 2), 2 * (l & 3) + (i & 1))
}

/// Element `i` of a multiplicand fragment held in registers `regs` of
/// lane `l`, packed `per_reg` to a register from the low bits up.
fn elem_of(r: &[u64], regs: &[Slot], l: usize, i: usize, ty: MmaElem) -> f64 {
    let n = ty.per_reg();
    let v = r[regs[i / n] as usize * 32 + l] as u32;
    let wide = |t: FloatTy, h: u32| {
        let m = CvtMode::default();
        f64::from_bits(numeric::cvt(
            CvtTy::Float(FloatTy::F64),
            CvtTy::Float(t),
            m,
            h as u64,
        ))
    };
    match ty {
        MmaElem::Tf32 => f32::from_bits(v & !0x1fff) as f64,
        MmaElem::F16 => wide(FloatTy::F16, v >> (16 * (i % 2)) & 0xffff),
        MmaElem::Bf16 => wide(FloatTy::Bf16, v >> (16 * (i % 2)) & 0xffff),
        MmaElem::S8 => (v >> (8 * (i % 4))) as u8 as i8 as f64,
        MmaElem::U8 => (v >> (8 * (i % 4))) as u8 as f64,
    }
}

/// Element `i` of an accumulator fragment (C).
fn acc_of(r: &[u64], regs: &[Slot], l: usize, i: usize, ty: MmaAcc) -> f64 {
    match ty {
        MmaAcc::F32 => f32::from_bits(r[regs[i] as usize * 32 + l] as u32) as f64,
        MmaAcc::S32 => r[regs[i] as usize * 32 + l] as u32 as i32 as f64,
        MmaAcc::F16 => elem_of(r, regs, l, i, MmaElem::F16),
    }
}

/// `mma.sync.aligned.m16n8kK.row.col`: D = A·B + C over the warp. Every
/// product is exact in f64 and so is every integer sum (|sum| < 2^53).
fn mma(w: &mut Warp, x: &Mma) {
    let k = x.k as usize;
    let (na, nb) = (16 * k / 32, 8 * k / 32);
    let mut a = [[0f64; 32]; 16];
    let mut b = [[0f64; 8]; 32];
    let mut c = [[0f64; 8]; 16];
    let r = &w.regs[w.reg_base * 32..];
    for l in 0..32 {
        for i in 0..na {
            let (row, col) = a_pos(x.a_elem, x.k, l, i);
            a[row][col] = elem_of(r, &x.a, l, i, x.a_elem);
        }
        for i in 0..nb {
            b[b_row(x.b_elem, x.k, l, i)][l >> 2] = elem_of(r, &x.b, l, i, x.b_elem);
        }
        for i in 0..4 {
            let (row, col) = c_pos(l, i);
            c[row][col] = acc_of(r, &x.c, l, i, x.c_ty);
        }
    }
    let mut d = [[0u32; 8]; 16];
    for i in 0..16 {
        for j in 0..8 {
            let mut acc = c[i][j];
            for kk in 0..k {
                acc += a[i][kk] * b[kk][j];
            }
            d[i][j] = round_acc(acc, x.d_ty, x.sat);
        }
    }
    let rb = w.reg_base * 32;
    for l in 0..32 {
        if x.d_ty == MmaAcc::F16 {
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

/// The f64 sum as D's bits: f32 or f16 rounded once to nearest even (NaN
/// canonical); s32 wrapped modulo 2^32, or clamped with `sat`.
fn round_acc(acc: f64, ty: MmaAcc, sat: bool) -> u32 {
    match ty {
        MmaAcc::S32 if sat => acc.clamp(i32::MIN as f64, i32::MAX as f64) as i32 as u32,
        MmaAcc::S32 => acc as i64 as u32,
        _ if acc.is_nan() => {
            if ty == MmaAcc::F16 {
                0x7fff
            } else {
                0x7fff_ffff
            }
        }
        MmaAcc::F16 => {
            let mode = CvtMode {
                rnd: Some(Rnd::Rn),
                ..CvtMode::default()
            };
            let f = CvtTy::Float;
            numeric::cvt(f(FloatTy::F16), f(FloatTy::F64), mode, acc.to_bits()) as u32
        }
        MmaAcc::F32 => (acc as f32).to_bits(),
    }
}
