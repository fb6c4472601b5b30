//! Kernels compiled for the widest vectors the CPU has.

/// Whether the CPU has AVX2 and FMA, the features of the hand-vectorised
/// f32 kernels (std caches the check).
pub(crate) fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
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
/// compiled for AVX-512 when the CPU has it, else for AVX2, else for the
/// build's baseline: the same source, vectorised as wide as the machine
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
                if is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    return unsafe { avx512($($arg),*) };
                }
                if is_x86_feature_detected!("avx2") {
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
