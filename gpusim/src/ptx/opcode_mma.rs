//! Decoding of the tensor-core instructions: `mma.sync.aligned` on
//! `.m16n8k4`/`.m16n8k8` `.tf32`, `.m16n8k8`/`.m16n8k16` `.f16`/`.bf16`
//! (`.row.col`; f32 accumulators, or f16 for `.f16` inputs),
//! `.m16n8k16`/`.m16n8k32` `.s8`/`.u8` (s32 accumulators, `.satfinite`),
//! `ldmatrix`/`stmatrix` `.sync.aligned.m8n8.{x1,x2,x4}{.trans}.b16`, and
//! `cvt.rna{.satfinite}.tf32.f32`.

use super::alu;
use super::decode::FnCtx;
use super::ir::*;
use super::parse::{Operand, RawInst};
use super::LoadError;

/// `cvt.rna.tf32.f32`: f32 bits rounded to TF32 (10 explicit mantissa
/// bits), to nearest with ties away from zero; the low 13 bits of the
/// result are 0. A NaN gives the canonical NaN; a value that rounds past
/// the largest TF32 becomes infinity, or with `SAT` (`.satfinite`) the
/// largest finite TF32 of its sign (infinities too).
pub(crate) fn tf32_rna<const SAT: bool>(x: u32) -> u32 {
    let mag = x & 0x7fff_ffff;
    if mag > 0x7f80_0000 {
        return 0x7fff_ffff;
    }
    let r = if mag == 0x7f80_0000 {
        mag
    } else {
        (mag + 0x1000) & !0x1fff
    };
    let r = if SAT && r >= 0x7f80_0000 {
        0x7f7f_e000
    } else {
        r
    };
    (x & 0x8000_0000) | r
}

struct CvtTf32<const SAT: bool>;
impl<const SAT: bool> alu::B1 for CvtTf32<SAT> {
    #[inline(always)]
    fn f(a: u64) -> u64 {
        tf32_rna::<SAT>(a as u32) as u64
    }
}

/// Decodes `cvt.rna{.satfinite}.tf32.f32 d, a`.
pub(crate) fn cvt_tf32(cx: &mut FnCtx, ri: &RawInst) -> Result<Op, LoadError> {
    let line = ri.line;
    let f: alu::UnFn = match ri.opcode.as_str() {
        "cvt.rna.tf32.f32" => alu::un::<CvtTf32<false>>,
        "cvt.rna.satfinite.tf32.f32" => alu::un::<CvtTf32<true>>,
        _ => {
            return Err(LoadError {
                line,
                message: format!(
                    "unsupported instruction `{}` (only cvt.rna{{.satfinite}}.tf32.f32)",
                    ri.text.trim()
                ),
            })
        }
    };
    if ri.operands.len() != 2 {
        return Err(LoadError {
            line,
            message: format!("`{}` takes 2 operands", ri.opcode),
        });
    }
    Ok(Op::Un {
        f,
        d: cx.dst(&ri.operands[0], line)?,
        a: cx.src(&ri.operands[1], 32, true, line)?,
    })
}

/// The registers of a `{…}` operand: exactly `n`, each decoded by `one`.
fn regs<const N: usize>(
    o: &Operand,
    n: usize,
    line: usize,
    mut one: impl FnMut(&Operand) -> Result<Slot, LoadError>,
) -> Result<[Slot; N], LoadError> {
    let items: Vec<Operand> = match o {
        Operand::Vec(v) => v.clone(),
        o if n == 1 => vec![o.clone()],
        o => {
            return Err(LoadError {
                line,
                message: format!("expected a vector of {n} registers, found {o:?}"),
            })
        }
    };
    if items.len() != n {
        return Err(LoadError {
            line,
            message: format!("expected {n} registers, found {}", items.len()),
        });
    }
    let mut out = [SINK; N];
    for (i, it) in items.iter().enumerate() {
        out[i] = one(it)?;
    }
    Ok(out)
}

/// Decodes `mma.sync.aligned…`, `ldmatrix.sync.aligned…` and
/// `stmatrix.sync.aligned…`.
pub(crate) fn mma(cx: &mut FnCtx, ri: &RawInst) -> Result<Op, LoadError> {
    let line = ri.line;
    let unsupported = || LoadError {
        line,
        message: format!(
            "unsupported instruction `{}` (mma: m16n8k4/k8 .tf32, m16n8k8/k16 .f16/.bf16, \
             m16n8k16/k32 .s8/.u8, .row.col; ldmatrix/stmatrix: m8n8 .b16)",
            ri.text.trim()
        ),
    };
    let parts: Vec<&str> = ri.opcode.split('.').collect();
    if parts[0] != "mma" {
        return ldmatrix(cx, ri, &parts).ok_or_else(unsupported)?;
    }
    let (shape, sat, types) = match parts[..] {
        ["mma", "sync", "aligned", shape, "row", "col", "satfinite", ref t @ ..] => {
            (shape, true, t)
        }
        ["mma", "sync", "aligned", shape, "row", "col", ref t @ ..] => (shape, false, t),
        _ => return Err(unsupported()),
    };
    let &[dt, at, bt, ct] = types else {
        return Err(unsupported());
    };
    let (a_elem, b_elem, c_ty, d_ty, k) =
        mma_types(shape, sat, [dt, at, bt, ct]).ok_or_else(unsupported)?;
    let ops = &ri.operands;
    if ops.len() != 4 {
        return Err(unsupported());
    }
    // Registers per fragment (PTX ISA, "Matrix Fragments for mma.m16n8kK"):
    // A holds 16·K elements, B 8·K, over 32 lanes.
    let na = 16 * k as usize / 32 / a_elem.per_reg();
    let nb = 8 * k as usize / 32 / b_elem.per_reg();
    let nacc = |t: MmaAcc| if t == MmaAcc::F16 { 2 } else { 4 };
    let d = regs(&ops[0], nacc(d_ty), line, |o| cx.dst(o, line))?;
    let a = regs(&ops[1], na, line, |o| cx.src(o, 32, false, line))?;
    let b = regs(&ops[2], nb, line, |o| cx.src(o, 32, false, line))?;
    let c_float = c_ty == MmaAcc::F32;
    let c = regs(&ops[3], nacc(c_ty), line, |o| cx.src(o, 32, c_float, line))?;
    Ok(Op::Mma(Box::new(Mma {
        k,
        a_elem,
        b_elem,
        c_ty,
        d_ty,
        sat,
        d,
        a,
        b,
        c,
    })))
}

/// The supported `mma` shape/type combinations: (A, B, C, D, K).
fn mma_types(
    shape: &str,
    sat: bool,
    [dt, at, bt, ct]: [&str; 4],
) -> Option<(MmaElem, MmaElem, MmaAcc, MmaAcc, u8)> {
    let int = |t: &str| match t {
        "s8" => Some(MmaElem::S8),
        "u8" => Some(MmaElem::U8),
        _ => None,
    };
    if let (Some(a), Some(b)) = (int(at), int(bt)) {
        let k = match shape {
            "m16n8k16" => 16,
            "m16n8k32" => 32,
            _ => return None,
        };
        return (dt == "s32" && ct == "s32").then_some((a, b, MmaAcc::S32, MmaAcc::S32, k));
    }
    let (elem, k) = match (at, bt, shape) {
        ("tf32", "tf32", "m16n8k4") => (MmaElem::Tf32, 4),
        ("tf32", "tf32", "m16n8k8") => (MmaElem::Tf32, 8),
        ("f16", "f16", "m16n8k8") => (MmaElem::F16, 8),
        ("f16", "f16", "m16n8k16") => (MmaElem::F16, 16),
        ("bf16", "bf16", "m16n8k8") => (MmaElem::Bf16, 8),
        ("bf16", "bf16", "m16n8k16") => (MmaElem::Bf16, 16),
        _ => return None,
    };
    let acc = |t: &str| match t {
        "f32" => Some(MmaAcc::F32),
        "f16" if elem == MmaElem::F16 => Some(MmaAcc::F16),
        _ => None,
    };
    if sat {
        return None;
    }
    Some((elem, elem, acc(ct)?, acc(dt)?, k))
}

/// `ldmatrix.sync.aligned.m8n8.xN{.trans}{.shared{::cta}}.b16 {r…}, [a]`
/// or `stmatrix…b16 [a], {r…}`; `None` when the form is not supported.
fn ldmatrix(cx: &mut FnCtx, ri: &RawInst, parts: &[&str]) -> Option<Result<Op, LoadError>> {
    let [base @ ("ldmatrix" | "stmatrix"), "sync", "aligned", "m8n8", num, ref rest @ ..] =
        parts[..]
    else {
        return None;
    };
    let num = match num {
        "x1" => 1,
        "x2" => 2,
        "x4" => 4,
        _ => return None,
    };
    let (mut trans, mut space, mut b16) = (false, Space::Generic, false);
    for m in rest {
        match *m {
            "trans" => trans = true,
            "shared" | "shared::cta" => space = Space::Shared,
            "b16" => b16 = true,
            _ => return None,
        }
    }
    if !b16 || ri.operands.len() != 2 {
        return None;
    }
    let line = ri.line;
    let load = base == "ldmatrix";
    let (r_op, a_op) = if load { (0, 1) } else { (1, 0) };
    let decoded = (|| {
        let d = regs(&ri.operands[r_op], num as usize, line, |o| match load {
            true => cx.dst(o, line),
            false => cx.src(o, 32, false, line),
        })?;
        let addr = cx.addr(&ri.operands[a_op], line)?;
        let rows = [cx.scratch(), cx.scratch(), cx.scratch(), cx.scratch()];
        let x = Box::new(Matrix8x8 {
            num,
            trans,
            space,
            d,
            addr,
            rows,
        });
        Ok(if load {
            Op::Ldmatrix(x)
        } else {
            Op::Stmatrix(x)
        })
    })();
    Some(decoded)
}
