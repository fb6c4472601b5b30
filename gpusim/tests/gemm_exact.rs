//! The blocked, multi-threaded GEMM against the plain loop it replaced
//! (one sequential FMA chain per element), bit for bit: random odd shapes
//! with k up to 3000, every transpose, every type combination, TF32,
//! alpha/beta cases, padded leading dimensions and strided batches, and
//! the sanitizer's errors for unwritten and freed operands.

use half::{bf16, f16};
use leangrad_gpusim::cublas::gemm::{round_tf32, Compute, Elem, Gemm};
use leangrad_gpusim::memory::DeviceMemory;
use leangrad_gpusim::numeric::{cvt, CvtMode, CvtTy, FloatTy, Rnd};

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Values of mixed magnitude and sign, so rounding depends on order.
    fn value(&mut self) -> f64 {
        let v = (self.next() >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
        v * [1.0, 1e3, 1e-3, 7.0, 1e-6][self.below(5)]
    }
}

fn encode(v: f64, t: Elem) -> Vec<u8> {
    match t {
        Elem::F32 => (v as f32).to_le_bytes().to_vec(),
        Elem::F64 => v.to_le_bytes().to_vec(),
        Elem::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
        Elem::Bf16 => bf16::from_f64(v).to_le_bytes().to_vec(),
    }
}

fn decode(b: &[u8], t: Elem) -> f64 {
    match t {
        Elem::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        Elem::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        Elem::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        Elem::Bf16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
    }
}

/// `v` rounded once to C's type, as the GPU stores the accumulator.
fn store(v: f64, t: Elem) -> Vec<u8> {
    let half = |ty| {
        let mode = CvtMode {
            rnd: Some(Rnd::Rn),
            ..CvtMode::default()
        };
        (cvt(
            CvtTy::Float(ty),
            CvtTy::Float(FloatTy::F64),
            mode,
            v.to_bits(),
        ) as u16)
            .to_le_bytes()
    };
    match t {
        Elem::F32 => (v as f32).to_le_bytes().to_vec(),
        Elem::F64 => v.to_le_bytes().to_vec(),
        Elem::F16 => half(FloatTy::F16).to_vec(),
        Elem::Bf16 => half(FloatTy::Bf16).to_vec(),
    }
}

/// The accumulator arithmetic of the reference.
trait Acc: Copy + Default + std::ops::Mul<Output = Self> {
    fn fma(self, b: Self, c: Self) -> Self;
    fn of(v: f64) -> Self;
    fn widen(self) -> f64;
}

impl Acc for f32 {
    fn fma(self, b: f32, c: f32) -> f32 {
        self.mul_add(b, c)
    }
    fn of(v: f64) -> f32 {
        v as f32
    }
    fn widen(self) -> f64 {
        self as f64
    }
}

impl Acc for f64 {
    fn fma(self, b: f64, c: f64) -> f64 {
        self.mul_add(b, c)
    }
    fn of(v: f64) -> f64 {
        v
    }
    fn widen(self) -> f64 {
        self
    }
}

/// Element `(r, c)` of batch `bt` of a stored matrix, as a value.
fn at(
    mem: &DeviceMemory,
    base: u64,
    ld: usize,
    st: i64,
    bt: usize,
    (r, c): (usize, usize),
    t: Elem,
) -> f64 {
    let es = t.size() as i64;
    let addr = base as i64 + (bt as i64 * st + (r + c * ld) as i64) * es;
    let mut b = vec![0u8; es as usize];
    mem.read(addr as u64, &mut b, true).unwrap();
    decode(&b, t)
}

/// The plain loop, on a copy of `mem`'s view: C's bytes of every batch.
fn reference<T: Acc>(g: &Gemm, mem: &DeviceMemory) -> Vec<Vec<u8>> {
    let conv = |v: f64| {
        if g.compute == Compute::Tf32 {
            T::of(round_tf32(v as f32) as f64)
        } else {
            T::of(v)
        }
    };
    let (alpha, beta) = (T::of(g.alpha), T::of(g.beta));
    let reads_ab = g.k > 0 && g.alpha != 0.0;
    let mut out = Vec::new();
    for bt in 0..g.batch {
        // op(A) by rows and op(B) by columns, converted, read up front.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        if reads_ab {
            for i in 0..g.m {
                for p in 0..g.k {
                    let ai = if g.transa { (p, i) } else { (i, p) };
                    a.push(conv(at(mem, g.a, g.lda, g.stride_a, bt, ai, g.ab)));
                }
            }
            for j in 0..g.n {
                for p in 0..g.k {
                    let bi = if g.transb { (j, p) } else { (p, j) };
                    b.push(conv(at(mem, g.b, g.ldb, g.stride_b, bt, bi, g.ab)));
                }
            }
        }
        let mut c = Vec::new();
        for j in 0..g.n {
            for i in 0..g.m {
                let c_old = || T::of(at(mem, g.c, g.ldc, g.stride_c, bt, (i, j), g.ct));
                let r = if reads_ab {
                    let mut acc = T::default();
                    for p in 0..g.k {
                        acc = a[i * g.k + p].fma(b[j * g.k + p], acc);
                    }
                    if g.beta == 0.0 {
                        alpha * acc
                    } else {
                        alpha.fma(acc, beta * c_old())
                    }
                } else if g.beta == 0.0 {
                    T::default()
                } else {
                    beta * c_old()
                };
                c.extend(store(r.widen(), g.ct));
            }
        }
        out.push(c);
    }
    out
}

/// An allocation of `elems` random elements of type `t`.
fn random(mem: &mut DeviceMemory, rng: &mut Rng, elems: usize, t: Elem) -> u64 {
    let bytes: Vec<u8> = (0..elems).flat_map(|_| encode(rng.value(), t)).collect();
    let p = mem.alloc(bytes.len().max(1) as u64).unwrap();
    mem.write(p, &bytes).unwrap();
    p
}

/// Type combinations: A/B, C, compute.
const TYPES: &[(Elem, Elem, Compute)] = &[
    (Elem::F32, Elem::F32, Compute::F32),
    (Elem::F32, Elem::F32, Compute::Tf32),
    (Elem::F16, Elem::F16, Compute::F32),
    (Elem::Bf16, Elem::Bf16, Compute::F32),
    (Elem::Bf16, Elem::F32, Compute::F32),
    (Elem::F16, Elem::F32, Compute::Tf32),
    (Elem::F64, Elem::F64, Compute::F64),
];

const SCALES: &[(f64, f64)] = &[
    (1.0, 0.0),
    (0.75, 0.0),
    (1.25, -0.5),
    (0.0, 2.0),
    (-1.0, 1.0),
];

/// A random GEMM of shape `(m, n, k)` on fresh operands in `mem`.
fn case(mem: &mut DeviceMemory, rng: &mut Rng, (m, n, k): (usize, usize, usize)) -> Gemm {
    let (ab, ct, compute) = TYPES[rng.below(TYPES.len())];
    let (alpha, beta) = SCALES[rng.below(SCALES.len())];
    let (transa, transb) = (rng.below(2) == 1, rng.below(2) == 1);
    let batch = 1 + rng.below(3);
    let ((ar, ac), (br, bc)) = (
        if transa { (k, m) } else { (m, k) },
        if transb { (n, k) } else { (k, n) },
    );
    // Padded leading dimensions and gaps between batches.
    let (lda, ldb, ldc) = (ar + rng.below(3), br + rng.below(3), m + rng.below(3));
    let (sa, sb, sc) = (
        lda * ac.max(1) + rng.below(5),
        ldb * bc.max(1) + rng.below(5),
        ldc * n + rng.below(5),
    );
    Gemm {
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        beta,
        a: random(mem, rng, sa * batch, ab),
        lda,
        stride_a: sa as i64,
        b: random(mem, rng, sb * batch, ab),
        ldb,
        stride_b: sb as i64,
        c: random(mem, rng, sc * batch, ct),
        ldc,
        stride_c: sc as i64,
        batch,
        ab,
        ct,
        compute,
    }
}

/// Runs `g` and checks every batch of C against the reference, bit for
/// bit; the padding of C stays as it was.
fn check(mem: &mut DeviceMemory, g: &Gemm) {
    let want = match g.compute {
        Compute::F64 => reference::<f64>(g, mem),
        _ => reference::<f32>(g, mem),
    };
    let es = g.ct.size();
    let span = (g.stride_c as usize * g.batch) * es;
    let mut before = vec![0u8; span];
    mem.read(g.c, &mut before, false).unwrap();
    g.run(mem).unwrap();
    let mut after = vec![0u8; span];
    mem.read(g.c, &mut after, false).unwrap();
    for (bt, want) in want.iter().enumerate() {
        for j in 0..g.n {
            for i in 0..g.m {
                let off = (bt * g.stride_c as usize + i + j * g.ldc) * es;
                let w = &want[(i + j * g.m) * es..][..es];
                assert_eq!(&after[off..off + es], w, "batch {bt} C[{i}][{j}] of {g:?}");
                before[off..off + es].copy_from_slice(w);
            }
        }
    }
    assert_eq!(after, before, "C's padding changed: {g:?}");
}

#[test]
fn random_gemms_match_the_plain_loop_bit_for_bit() {
    let mut mem = DeviceMemory::new(1 << 31);
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let dims = [1, 2, 3, 5, 7, 15, 16, 17, 31, 33, 63];
    for _ in 0..300 {
        let m = dims[rng.below(dims.len())];
        let n = dims[rng.below(dims.len())];
        let k = [0, 1, 2, 3, 7, 33, 255, 257, 513][rng.below(9)];
        let g = case(&mut mem, &mut rng, (m, n, k));
        check(&mut mem, &g);
    }
}

#[test]
fn long_and_threaded_gemms_match_the_plain_loop_bit_for_bit() {
    let mut mem = DeviceMemory::new(1 << 32);
    let mut rng = Rng(0x0dd_c0ffee);
    // k across many blocks; sizes above the threading threshold.
    for shape in [
        (37, 29, 3001),
        (129, 70, 1000),
        (3, 200, 2999),
        (300, 45, 517),
        (1, 1, 3000),
    ] {
        for _ in 0..3 {
            let g = case(&mut mem, &mut rng, shape);
            check(&mut mem, &g);
        }
    }
}

#[test]
fn unwritten_and_freed_operands_fail_as_before() {
    let mut mem = DeviceMemory::new(1 << 24);
    let mut rng = Rng(77);
    let mut g = case(&mut mem, &mut rng, (9, 8, 20));
    g.alpha = 1.0;
    g.batch = 1;
    // A fresh A never written: the first column read is reported.
    g.a = mem.alloc(10_000).unwrap();
    let e = g.run(&mut mem).unwrap_err();
    assert!(format!("{e:?}").contains("reading A column 0"), "{e:?}");
    // B freed.
    let mut h = case(&mut mem, &mut rng, (9, 8, 20));
    (h.alpha, h.beta) = (1.0, 0.5);
    mem.free(h.b).unwrap();
    let e = h.run(&mut mem).unwrap_err();
    assert!(format!("{e:?}").contains("reading B column 0"), "{e:?}");
    // Nothing of A or B is read when alpha = 0: freed operands are fine.
    h.alpha = 0.0;
    check(&mut mem, &h);
}
