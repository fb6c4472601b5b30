//! Kernels compiled for the widest vectors the CPU has.

/// The instruction sets the hand-vectorised CPU kernels are compiled for,
/// narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuPath {
    /// Plain Rust (and the `gemm` crate), vectorised as the build's baseline
    /// target allows: every CPU.
    Portable,
    /// AVX2 with FMA (256-bit vectors): x86 CPUs since 2013.
    Avx2,
    /// AVX-512 F (512-bit vectors and lane masks), with AVX2 and FMA: Intel
    /// Xeon since Skylake-SP, AMD since Zen 4.
    Avx512,
}

impl CpuPath {
    /// Every path, narrowest first.
    pub const ALL: [CpuPath; 3] = [CpuPath::Portable, CpuPath::Avx2, CpuPath::Avx512];

    /// The widest path this CPU can run.
    pub fn widest() -> CpuPath {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if avx2 && is_x86_feature_detected!("avx512f") {
                return CpuPath::Avx512;
            }
            if avx2 {
                return CpuPath::Avx2;
            }
        }
        CpuPath::Portable
    }

    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        self <= CpuPath::widest()
    }

    /// The name `LEANGRAD_CPU_PATH` takes: `portable`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            CpuPath::Portable => "portable",
            CpuPath::Avx2 => "avx2",
            CpuPath::Avx512 => "avx512",
        }
    }
}

impl std::fmt::Display for CpuPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The environment variable that narrows the CPU kernels' path.
pub const CPU_PATH_VAR: &str = "LEANGRAD_CPU_PATH";

/// The path the CPU kernels of this process run: the widest the CPU has
/// ([`CpuPath::widest`]), or a narrower one named by `LEANGRAD_CPU_PATH`
/// (`portable`, `avx2`, `avx512`), for tests and comparisons. A path the
/// CPU lacks, or a name that is none of these, runs the widest path with a
/// warning on stderr. Read once per process.
pub fn cpu_path() -> CpuPath {
    static PATH: std::sync::OnceLock<CpuPath> = std::sync::OnceLock::new();
    *PATH.get_or_init(|| {
        let widest = CpuPath::widest();
        let Some(asked) = std::env::var_os(CPU_PATH_VAR) else {
            return widest;
        };
        let asked = asked.to_string_lossy();
        match CpuPath::ALL.into_iter().find(|p| p.name() == asked) {
            Some(path) if path <= widest => path,
            Some(path) => {
                eprintln!(
                    "leangrad: {CPU_PATH_VAR}={path}, but this CPU's widest path is {widest}; \
                     running {widest}"
                );
                widest
            }
            None => {
                eprintln!(
                    "leangrad: {CPU_PATH_VAR}={asked:?} is not one of portable, avx2, avx512; \
                     running {widest}"
                );
                widest
            }
        }
    })
}

/// Whether the kernels run AVX2 and FMA code ([`cpu_path`] is AVX2 or
/// wider).
pub(crate) fn avx2_fma() -> bool {
    cpu_path() >= CpuPath::Avx2
}

/// Whether the kernels run AVX-512 code ([`cpu_path`] is AVX-512).
pub(crate) fn avx512() -> bool {
    cpu_path() == CpuPath::Avx512
}

/// `s` as `f32` elements when `T` is `f32`.
pub(crate) fn as_f32<T: crate::FloatDType>(s: &[T]) -> Option<&[f32]> {
    // SAFETY: a dtype of F32 is the type f32: same size, alignment, bits.
    (T::DTYPE == crate::DType::F32)
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
}

/// [`as_f32`] for a mutable slice.
pub(crate) fn as_f32_mut<T: crate::FloatDType>(s: &mut [T]) -> Option<&mut [f32]> {
    // SAFETY: as in `as_f32`; the borrow of `s` moves to the result.
    (T::DTYPE == crate::DType::F32)
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<f32>(), s.len()) })
}

/// Defines `$name`, which runs the `#[inline(always)]` kernel `$inner`
/// compiled for AVX-512 when [`cpu_path`] is AVX-512, AVX2 when it is AVX2,
/// else for the build's baseline: the same source, vectorised as wide as the machine
/// allows (no FMA is enabled, so every value rounds as in the baseline).
macro_rules! widest_vectors {
    (
        $(#[$doc:meta])*
        fn $name:ident<$($g:ident: $bound:path),*>($($arg:ident: $ty:ty),* $(,)?)
            $(-> $ret:ty)? => $inner:ident
    ) => {
        $(#[$doc])*
        fn $name<$($g: $bound),*>($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512<$($g: $bound),*>($($arg: $ty),*) $(-> $ret)? {
                    $inner($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2<$($g: $bound),*>($($arg: $ty),*) $(-> $ret)? {
                    $inner($($arg),*)
                }
                if $crate::primitives::avx512() {
                    // SAFETY: the CPU has AVX-512F.
                    return unsafe { avx512($($arg),*) };
                }
                if $crate::primitives::avx2_fma() {
                    // SAFETY: the CPU has AVX2.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $inner($($arg),*)
        }
    };
}
pub(crate) use widest_vectors;

/// The 8×8 transpose of eight AVX row vectors (register shuffles only).
/// Always inlined, so that it is compiled with its AVX caller's target
/// features.
///
/// # Safety
///
/// The CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn transpose8x8(
    r: [std::arch::x86_64::__m256; 8],
) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}
