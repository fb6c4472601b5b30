//! Synchronised batch norm (`SyncBatchNorm`): the batch statistics and the
//! input gradient's per-channel sums taken over every rank of a group, by
//! the two collectives of [`BatchStatsSync`]. Everything here is composed
//! of tensor ops, so it runs wherever the collectives do (CUDA over NCCL,
//! the meta device for a predicted rank, any device in tests).
//!
//! Forward: each rank's per-channel mean, biased variance and element
//! count (f64, unrounded) are all-gathered and combined in rank order,
//! `mean = Σ nᵣ·meanᵣ / N`, `var = Σ nᵣ·(varᵣ + (meanᵣ − mean)²) / N`
//! (Chan et al.'s parallel variance: no cancellation as in `E[x²] −
//! mean²`), the same on every rank; the running variance moves with
//! `var·N/(N−1)` (`N` the global count). Nothing crosses to the host.
//!
//! Backward (input gradient wanted): `dx = scale·(g − Σg/N − x̂·Σg·x̂/N)`
//! with both sums over all ranks (one all-reduce of `2C` values); this
//! rank's sums are also its weight and bias gradients, which data parallel
//! then averages. With the loss a mean per rank and gradients averaged
//! over ranks, the parameters move as one device's would on the
//! concatenated batch.

use super::{param_grads, NormGeom};
use crate::autograd::{may_reuse, no_grad};
use crate::memory::{uncounted, with_category, Category};
use crate::nn::BatchStatsSync;
use crate::primitives::contiguous_copy;
use crate::{DType, Error, Result, Tensor};

/// A batch's per-channel moments over every rank: f64 `[C]` tensors (and
/// the global count, `[1]`) on the input's device, outside the ledger as
/// the unsynchronised moments are.
pub(super) struct SyncedMoments {
    /// The mean over all ranks' elements.
    pub mean: Tensor,
    /// The biased variance over all ranks' elements (what `x̂` divides by).
    pub var: Tensor,
    /// `var·N/(N−1)`, what the running variance moves with.
    pub var_unbiased: Tensor,
    /// `N`, the number of elements per channel over all ranks.
    pub count: Tensor,
}

/// Combines this rank's unrounded f64 moments `mean`, `var` (`[C]`, over
/// `count` elements each) with the other ranks' (see the module doc).
pub(super) fn synced_moments(
    mean: &Tensor,
    var: &Tensor,
    count: usize,
    sync: &dyn BatchStatsSync,
) -> Result<SyncedMoments> {
    let c = mean.numel();
    let world = sync.world_size();
    uncounted(|| {
        let _ng = no_grad();
        let n = Tensor::full(&[1], count as f64, DType::F64, mean.device())?;
        let mine = Tensor::cat(&[mean, var, &n], 0)?;
        let all = sync.all_gather(&mine)?;
        if all.shape() != [world, 2 * c + 1] {
            return Err(Error::InvalidArgument {
                op: "sync_batch_norm",
                msg: format!(
                    "the gathered statistics of {world} ranks × {} values came back as {:?}",
                    2 * c + 1,
                    all.shape()
                ),
            });
        }
        let means = all.narrow(1, 0, c)?;
        let vars = all.narrow(1, c, c)?;
        let counts = all.narrow(1, 2 * c, 1)?;
        let total = counts.sum(&[0], false)?;
        let mean = means.mul(&counts)?.sum(&[0], false)?.div(&total)?;
        let spread = means.sub(&mean)?.square()?;
        let var = vars
            .add(&spread)?
            .mul(&counts)?
            .sum(&[0], false)?
            .div(&total)?;
        let var_unbiased = var.mul(&total.div(&total.sub_scalar(1.0)?)?)?;
        Ok(SyncedMoments {
            mean,
            var,
            var_unbiased,
            count: total,
        })
    })
}

/// What the synchronised input gradient reads besides `g`.
pub(super) struct SyncedGrad<'a> {
    /// `x̂`, written over (it is not needed afterwards) when nothing else
    /// holds it.
    pub xhat: Tensor,
    /// `weight·invstd` per channel (statistics dtype).
    pub scale: &'a Tensor,
    /// The global count per channel, `[1]` f64.
    pub count: &'a Tensor,
    pub sync: &'a dyn BatchStatsSync,
}

/// The input gradient over all ranks and this rank's weight and bias sums
/// `(dx, Σ g·x̂, Σ g)` (see the module doc); `dx` is written over `g` when
/// buffer reuse is on and nothing else holds `g`.
pub(super) fn synced_input_grad(
    g: Tensor,
    geo: NormGeom,
    s: SyncedGrad<'_>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let c = geo.nstat();
    let (sum_gx, sum_g) = param_grads(&g, Some(&s.xhat), geo, true, &[c])?;
    let missing = || Error::Backward("sync_batch_norm: per-channel sums missing".into());
    let (sum_gx, sum_g) = (sum_gx.ok_or_else(missing)?, sum_g.ok_or_else(missing)?);
    let dt = g.dtype();
    // The means the input gradient subtracts, per channel, over all ranks.
    let (mean_g, mean_gx, scale) = uncounted(|| {
        let _ng = no_grad();
        let sums = Tensor::cat(&[&sum_g, &sum_gx], 0)?;
        s.sync.all_reduce_sum(&sums)?;
        let n = s.count.to_dtype(dt)?;
        let stat = [1, c, 1];
        let mean_g = sums.narrow(0, 0, c)?.div(&n)?.reshape(&stat)?;
        let mean_gx = sums.narrow(0, c, c)?.div(&n)?.reshape(&stat)?;
        Ok((mean_g, mean_gx, s.scale.to_dtype(dt)?.reshape(&stat)?))
    })?;
    let _ng = no_grad();
    let full = [geo.a, c, geo.b];
    let dx = match may_reuse(&g) && g.is_contiguous() {
        true => g,
        false => contiguous_copy(&g)?,
    };
    let over_xhat = s.xhat.is_exclusive() && s.xhat.is_contiguous();
    let (dx3, xhat3) = (dx.reshape(&full)?, s.xhat.reshape(&full)?);
    if over_xhat {
        xhat3.mul_(&mean_gx)?;
        dx3.sub_(&xhat3)?;
    } else {
        let _ws = with_category(Category::Workspace);
        dx3.sub_(&xhat3.mul(&mean_gx)?)?;
    }
    dx3.sub_(&mean_g)?;
    dx3.mul_(&scale)?;
    drop(dx3);
    Ok((dx, sum_gx, sum_g))
}
