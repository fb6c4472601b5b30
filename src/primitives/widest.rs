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
