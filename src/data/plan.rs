//! What an image pipeline will hold, computed from shapes before any pixel
//! is decoded: the plan of one step ([`StepPlan`]) and the bytes of an f32
//! image of a shape, all in saturating arithmetic (`usize::MAX` stands for
//! "more than any machine has": a product never wraps around).

/// What a step of an image pipeline will make of an f32 image of a given
/// shape, known before any pixel is read (see
/// [`super::Transform::plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// The shape of the step's output.
    pub shape: Vec<usize>,
    /// The most host bytes the step holds at once, its input included: an
    /// upper bound for random steps; saturating (`usize::MAX`: more than
    /// any machine has).
    pub bytes: usize,
}

/// Bytes of an f32 tensor of `shape` (saturating).
pub(crate) fn f32_bytes(shape: &[usize]) -> usize {
    shape.iter().fold(4usize, |n, &d| n.saturating_mul(d))
}
