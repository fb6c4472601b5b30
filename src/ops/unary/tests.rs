//! Unit tests of the unary kernels: erf against reference values, and
//! the CUDA form of every kernel.

use super::*;

/// Every kernel `src/ops/unary.rs` runs, forward and backward, has a CUDA form
/// (so none of these ops is `NotOnCuda`), and no two kernels map to the
/// same CUDA op (a copy-paste slip in a `cuda()` would give two ops one
/// formula).
#[test]
fn every_kernel_has_a_distinct_cuda_form() {
    let forward = [
        (NegK::NAME, NegK.cuda()),
        (ExpK::NAME, ExpK.cuda()),
        (LogK::NAME, LogK.cuda()),
        (SqrtK::NAME, SqrtK.cuda()),
        (AbsK::NAME, AbsK.cuda()),
        (SquareK::NAME, SquareK.cuda()),
        (RecipK::NAME, RecipK.cuda()),
        (SinK::NAME, SinK.cuda()),
        (CosK::NAME, CosK.cuda()),
        (TanhK::NAME, TanhK.cuda()),
        (SigmoidK::NAME, SigmoidK.cuda()),
        (SiluK::NAME, SiluK.cuda()),
        (ReluK::NAME, ReluK.cuda()),
        (SignK::NAME, SignK.cuda()),
        (PowK::NAME, PowK(1.5).cuda()),
        (LeakyK::NAME, LeakyK(0.1).cuda()),
        ("gelu", GeluK(false).cuda()),
        ("gelu tanh", GeluK(true).cuda()),
    ];
    let backward = [
        (ExpB::NAME, ExpB.cuda()),
        (LogB::NAME, LogB.cuda()),
        (SqrtB::NAME, SqrtB.cuda()),
        (AbsB::NAME, AbsB.cuda()),
        (SquareB::NAME, SquareB.cuda()),
        (RecipB::NAME, RecipB.cuda()),
        (SinB::NAME, SinB.cuda()),
        (CosB::NAME, CosB.cuda()),
        (TanhB::NAME, TanhB.cuda()),
        (SigmoidB::NAME, SigmoidB.cuda()),
        (SiluB::NAME, SiluB.cuda()),
        (PowB::NAME, PowB(1.5).cuda()),
        ("gelu", GeluB(false).cuda()),
        ("gelu tanh", GeluB(true).cuda()),
    ];
    for (i, (name, op)) in forward.iter().enumerate() {
        assert!(op.is_some(), "{name} has no CUDA form");
        assert!(
            forward[..i].iter().all(|(_, o)| o != op),
            "{name} shares its CUDA op {op:?}"
        );
    }
    for (i, (name, op)) in backward.iter().enumerate() {
        assert!(op.is_some(), "{name} backward has no CUDA form");
        assert!(
            backward[..i].iter().all(|(_, o)| o != op),
            "{name} backward shares its CUDA op {op:?}"
        );
    }
    assert_eq!(PowB(2.0).cuda(), Some(CudaBinary::PowGrad(2.0)));
}

#[test]
fn erf_matches_reference_values() {
    let cases = [
        (0.0, 0.0),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.0, 1.0 - 2.209_049_699_858_544e-5),
        (4.0, 1.0 - 1.541_725_790_028_002e-8),
        (-1.0, -0.842_700_792_949_714_9),
        (f64::INFINITY, 1.0),
    ];
    for (x, want) in cases {
        assert!(
            (erf(x) - want).abs() < 1e-14,
            "erf({x}) = {} vs {want}",
            erf(x)
        );
    }
    assert!(erf(f64::NAN).is_nan());
    // The two branches meet at 3 without a jump.
    assert!((erf(3.0 - 1e-12) - erf(3.0)).abs() < 1e-14);
}
