//! cuBLAS's column-major GEMM, exactly: argument checks as the library
//! makes them, and the product computed on the host in the compute type.
//!
//! `C = alpha·op(A)·op(B) + beta·C` per batch, each element accumulated in
//! k order with one fused multiply-add per step (`acc = fma(a, b, acc)`,
//! starting from 0), then `alpha·acc` (beta = 0) or `fma(alpha, acc,
//! beta·C)`, rounded once to C's type. TF32 rounds each A and B element to
//! a 10-bit mantissa (to nearest, ties to even) first. beta = 0 never reads
//! C; alpha = 0 or k = 0 never reads A or B.
//!
//! The products come from the `kernel` module, which computes tiles of C
//! at once, in cache-sized blocks of k and on several threads, while
//! keeping every element's chain in k order, so the results are bit-
//! identical to the plain loop above (`tests/gemm_exact.rs` checks it).

use super::kernel::{self, mr, Acc};
use crate::driver::consts::*;
use crate::driver::errors::{DResult, DrvErr};
use crate::memory::DeviceMemory;
use crate::numeric::{cvt, CvtMode, CvtTy, FloatTy, Rnd};
use half::{bf16, f16};

/// An element type of A, B or C (`cudaDataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// `CUDA_R_32F`.
    F32,
    /// `CUDA_R_64F`.
    F64,
    /// `CUDA_R_16F`.
    F16,
    /// `CUDA_R_16BF`.
    Bf16,
}

impl Elem {
    /// From a `cudaDataType` value.
    pub fn from_cuda(t: u32) -> Option<Elem> {
        Some(match t {
            0 => Elem::F32,
            1 => Elem::F64,
            2 => Elem::F16,
            14 => Elem::Bf16,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F64 => 8,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }

    /// Decodes little-endian elements, appending them to `out` (one match
    /// per column, not per element).
    fn decode_into(self, bytes: &[u8], out: &mut Vec<f64>) {
        match self {
            Elem::F32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64),
            ),
            Elem::F64 => out.extend(
                bytes
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])),
            ),
            Elem::F16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64()),
            ),
            Elem::Bf16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64()),
            ),
        }
    }
}

/// How products are accumulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compute {
    /// f32 (`CUBLAS_COMPUTE_32F`, its pedantic form, legacy `CUDA_R_32F`).
    F32,
    /// f32 with A and B rounded to TF32 (`CUBLAS_COMPUTE_32F_FAST_TF32`,
    /// or 32F under `CUBLAS_TF32_TENSOR_OP_MATH`).
    Tf32,
    /// f64 (`CUBLAS_COMPUTE_64F`, pedantic, legacy `CUDA_R_64F`).
    F64,
}

/// One checked GEMM call (a non-batched call is a batch of one).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    /// op(A) = Aᵀ.
    pub transa: bool,
    /// op(B) = Bᵀ.
    pub transb: bool,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The contracted size.
    pub k: usize,
    /// alpha (an f32 value exactly, under f32 compute).
    pub alpha: f64,
    /// beta.
    pub beta: f64,
    /// A's address.
    pub a: u64,
    /// Leading dimension of A.
    pub lda: usize,
    /// Elements between batches of A.
    pub stride_a: i64,
    /// B's address.
    pub b: u64,
    /// Leading dimension of B.
    pub ldb: usize,
    /// Elements between batches of B.
    pub stride_b: i64,
    /// C's address.
    pub c: u64,
    /// Leading dimension of C.
    pub ldc: usize,
    /// Elements between batches of C.
    pub stride_c: i64,
    /// Number of products.
    pub batch: usize,
    /// Type of A and B.
    pub ab: Elem,
    /// Type of C.
    pub ct: Elem,
    /// Accumulation.
    pub compute: Compute,
}

/// Rounds an f32 to TF32 (10 explicit mantissa bits), to nearest, ties to
/// even; infinities and NaN unchanged.
pub fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let b = x.to_bits();
    let lsb = (b >> 13) & 1;
    f32::from_bits((b + 0xfff + lsb) & !0x1fff)
}

/// `v` rounded once to `ty` (f16 or bf16), to nearest, ties to even, as
/// the GPU converts the accumulator (`cvt.rn`). Not `half`'s `from_f64`:
/// it drops the low 32 bits of the f64 before rounding, so an f32
/// accumulator just above a tie by its lowest three mantissa bits (e.g.
/// `0x3dca8004` → bf16) was rounded down as if it were the tie.
fn round_half(ty: FloatTy, v: f64) -> u16 {
    let mode = CvtMode {
        rnd: Some(Rnd::Rn),
        ..CvtMode::default()
    };
    cvt(
        CvtTy::Float(ty),
        CvtTy::Float(FloatTy::F64),
        mode,
        v.to_bits(),
    ) as u16
}

/// The first and one-past-last byte of the batches of a stored
/// `rows × cols` matrix with leading dimension `ld` and batch stride `st`.
fn footprint(
    base: u64,
    rows: usize,
    cols: usize,
    ld: usize,
    st: i64,
    batch: usize,
    es: usize,
) -> Option<(u64, u64)> {
    let span = (cols as i128 - 1) * ld as i128 + rows as i128;
    let last = (batch as i128 - 1) * st as i128;
    let lo = base as i128 + last.min(0) * es as i128;
    let hi = base as i128 + (last.max(0) + span) * es as i128;
    (lo >= 0 && hi <= u64::MAX as i128).then_some((lo as u64, hi as u64))
}

impl Elem {
    /// The profile's name of this type.
    fn profile_type(self) -> crate::profile::GemmType {
        use crate::profile::GemmType;
        match self {
            Elem::F32 => GemmType::F32,
            Elem::F64 => GemmType::F64,
            Elem::F16 => GemmType::F16,
            Elem::Bf16 => GemmType::Bf16,
        }
    }
}

impl Gemm {
    /// The call as the profile records it.
    pub fn profile_record(&self, entry: &str) -> crate::profile::GemmRecord {
        use crate::profile::GemmCompute;
        crate::profile::GemmRecord {
            entry: entry.to_string(),
            transa: self.transa,
            transb: self.transb,
            m: self.m as u64,
            n: self.n as u64,
            k: self.k as u64,
            batch: self.batch as u64,
            ab_type: self.ab.profile_type(),
            c_type: self.ct.profile_type(),
            compute: match self.compute {
                Compute::F32 => GemmCompute::F32,
                Compute::Tf32 => GemmCompute::Tf32,
                Compute::F64 => GemmCompute::F64,
            },
            ld: [self.lda as u64, self.ldb as u64, self.ldc as u64],
        }
    }
}

impl Gemm {
    /// Whether A and B are read (not when alpha = 0 or k = 0).
    fn reads_ab(&self) -> bool {
        self.k > 0 && self.alpha != 0.0
    }

    /// Stored shape (rows, cols) of A and of B.
    fn shapes(&self) -> ((usize, usize), (usize, usize)) {
        let a = if self.transa {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let b = if self.transb {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        (a, b)
    }

    /// Checks that each operand's footprint over all batches lies inside
    /// one live allocation of `mem` (or inside a freed one: that use after
    /// free is reported by the run).
    pub fn check_footprints(&self, mem: &DeviceMemory) -> Result<(), String> {
        let ((ar, ac), (br, bc)) = self.shapes();
        let mut ops = vec![(
            "C",
            self.c,
            self.m,
            self.n,
            self.ldc,
            self.stride_c,
            self.ct,
        )];
        if self.reads_ab() {
            ops.push(("A", self.a, ar, ac, self.lda, self.stride_a, self.ab));
            ops.push(("B", self.b, br, bc, self.ldb, self.stride_b, self.ab));
        }
        for (name, base, r, c, ld, st, t) in ops {
            let (lo, hi) = footprint(base, r, c, ld, st, self.batch, t.size())
                .ok_or_else(|| format!("{name}'s footprint overflows the address space"))?;
            // An operand freed in stream order may already be gone when the
            // GEMM is enqueued (another thread's sync can run the free
            // first); whether it is depends on timing, so such a use after
            // free is left to the run, which faults on it at every timing.
            if mem.inside_freed(lo, hi - lo) {
                continue;
            }
            mem.find(lo, hi - lo).map_err(|e| {
                format!(
                    "{name} ({r}×{c}, ld {ld}, batch stride {st}, {} batches) spans {lo:#x}..{hi:#x}, not inside one live allocation: {e}",
                    self.batch
                )
            })?;
        }
        Ok(())
    }

    /// Reads the used `rows × cols` of a stored matrix column by column
    /// (padding rows are not read), handing each to `f` as values.
    #[allow(clippy::too_many_arguments)]
    fn read_cols(
        &self,
        mem: &DeviceMemory,
        name: &str,
        base: u64,
        (rows, cols): (usize, usize),
        ld: usize,
        t: Elem,
        mut f: impl FnMut(usize, &[f64]),
    ) -> DResult<()> {
        let es = t.size();
        let mut bytes = vec![0u8; rows * es];
        let mut col = Vec::with_capacity(rows);
        for j in 0..cols {
            let addr = base.wrapping_add((j * ld * es) as u64);
            mem.read(addr, &mut bytes, true).map_err(|e| {
                DrvErr::new(
                    CUDA_ERROR_ILLEGAL_ADDRESS,
                    format!("reading {name} column {j}: {e}"),
                )
            })?;
            col.clear();
            t.decode_into(&bytes, &mut col);
            f(j, &col);
        }
        Ok(())
    }

    /// Reads the used `rows × cols` of a stored matrix, as values.
    fn read(
        &self,
        mem: &DeviceMemory,
        name: &str,
        base: u64,
        shape: (usize, usize),
        ld: usize,
        t: Elem,
    ) -> DResult<Vec<f64>> {
        let mut out = Vec::with_capacity(shape.0 * shape.1);
        self.read_cols(mem, name, base, shape, ld, t, |_, c| {
            out.extend_from_slice(c)
        })?;
        Ok(out)
    }

    /// Runs every batch against `mem`.
    pub fn run(&self, mem: &mut DeviceMemory) -> DResult<()> {
        match self.compute {
            Compute::F64 => self.run_in::<f64, { mr::<f64>() }>(mem),
            Compute::F32 | Compute::Tf32 => self.run_in::<f32, { mr::<f32>() }>(mem),
        }
    }

    fn run_in<T: Acc, const MR: usize>(&self, mem: &mut DeviceMemory) -> DResult<()> {
        let (m, n, k) = (self.m, self.n, self.k);
        let (es_ab, es_c) = (self.ab.size() as i64, self.ct.size() as i64);
        let (mut ap, mut bp) = (Vec::new(), Vec::new());
        let mut acc = vec![T::default(); m * n];
        for batch in 0..self.batch as i64 {
            let at = |base: u64, st: i64, es: i64| base.wrapping_add((batch * st * es) as u64);
            let c_base = at(self.c, self.stride_c, es_c);
            if self.reads_ab() {
                let a_base = at(self.a, self.stride_a, es_ab);
                let b_base = at(self.b, self.stride_b, es_ab);
                self.pack::<T, MR>(mem, a_base, b_base, &mut ap, &mut bp)?;
                kernel::product::<T, MR>((m, n, k), &ap, &bp, &mut acc);
            }
            let c_old = if self.beta != 0.0 {
                self.read(mem, "C", c_base, (m, n), self.ldc, self.ct)?
            } else {
                Vec::new()
            };
            self.write_c(mem, c_base, &acc, &c_old)?;
        }
        Ok(())
    }

    /// Reads one batch's A and B (in that order) and packs op(A) and op(B)
    /// in the compute type, TF32-rounded if so, for [`kernel::product`].
    fn pack<T: Acc, const MR: usize>(
        &self,
        mem: &DeviceMemory,
        a_base: u64,
        b_base: u64,
        ap: &mut Vec<T>,
        bp: &mut Vec<T>,
    ) -> DResult<()> {
        let (sa, sb) = self.shapes();
        let tf32 = self.compute == Compute::Tf32;
        let conv = |v: f64| -> T {
            if tf32 {
                T::of(round_tf32(v as f32) as f64)
            } else {
                T::of(v)
            }
        };
        // Stored A is m × k (lanes = rows) or, transposed, k × m; stored B
        // is k × n (lanes = columns) or, transposed, n × k.
        let pa = kernel::Packing::new(sa, self.transa, MR, ap);
        self.read_cols(mem, "A", a_base, sa, self.lda, self.ab, |c, col| {
            pa.column(ap, c, col, conv)
        })?;
        let pb = kernel::Packing::new(sb, !self.transb, kernel::NR, bp);
        self.read_cols(mem, "B", b_base, sb, self.ldb, self.ab, |c, col| {
            pb.column(bp, c, col, conv)
        })?;
        Ok(())
    }

    /// Scales the products `acc` (`m × n`, column-major; unused when A and
    /// B are not read) by alpha, adds beta·`c_old` unless beta = 0, rounds
    /// to C's type and writes C column by column.
    fn write_c<T: Acc>(
        &self,
        mem: &mut DeviceMemory,
        c_base: u64,
        acc: &[T],
        c_old: &[f64],
    ) -> DResult<()> {
        let (m, n) = (self.m, self.n);
        let es_c = self.ct.size();
        let (alpha, beta) = (T::of(self.alpha), T::of(self.beta));
        let mut out = vec![0u8; m * es_c];
        for j in 0..n {
            for i in 0..m {
                let r = if self.reads_ab() {
                    let acc = acc[i + j * m];
                    if self.beta == 0.0 {
                        alpha * acc
                    } else {
                        alpha.fma(acc, beta * T::of(c_old[i + j * m]))
                    }
                } else if self.beta == 0.0 {
                    T::default()
                } else {
                    beta * T::of(c_old[i + j * m])
                };
                let v = r.widen();
                let o = &mut out[i * es_c..(i + 1) * es_c];
                match self.ct {
                    Elem::F32 => o.copy_from_slice(&(v as f32).to_le_bytes()),
                    Elem::F64 => o.copy_from_slice(&v.to_le_bytes()),
                    Elem::F16 => o.copy_from_slice(&round_half(FloatTy::F16, v).to_le_bytes()),
                    Elem::Bf16 => o.copy_from_slice(&round_half(FloatTy::Bf16, v).to_le_bytes()),
                }
            }
            let addr = c_base.wrapping_add((j * self.ldc * es_c) as u64);
            mem.write(addr, &out).map_err(|e| {
                DrvErr::new(
                    CUDA_ERROR_ILLEGAL_ADDRESS,
                    format!("writing C column {j}: {e}"),
                )
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tf32_rounds_to_nearest_even_on_ten_bits() {
        let one = 1.0f32;
        let ulp = 2f32.powi(-10); // TF32 keeps 10 mantissa bits: its ulp at 1.0
        assert_eq!(round_tf32(one + ulp / 4.0), one);
        assert_eq!(round_tf32(one + ulp * 0.75), one + ulp);
        // A tie goes to the even mantissa: 1 + ulp/2 → 1, 1 + 1.5 ulp → 1 + 2 ulp.
        assert_eq!(round_tf32(one + ulp / 2.0), one);
        assert_eq!(round_tf32(one + ulp * 1.5), one + 2.0 * ulp);
        assert_eq!(round_tf32(-(one + ulp * 0.75)), -(one + ulp));
        assert!(round_tf32(f32::NAN).is_nan());
        assert_eq!(round_tf32(f32::MAX), f32::INFINITY);
    }

    #[test]
    fn footprints_cover_every_batch() {
        // 3×2 with ld 4, stride 10, 3 batches of 4-byte elements.
        assert_eq!(
            footprint(1000, 3, 2, 4, 10, 3, 4),
            Some((1000, 1000 + (20 + 7) * 4))
        );
        assert_eq!(
            footprint(1000, 3, 2, 4, -10, 3, 4),
            Some((1000 - 80, 1000 + 28))
        );
        assert_eq!(footprint(1000, 3, 2, 4, 0, 5, 4), Some((1000, 1028)));
    }
}
