//! The convolutions' Workspace budget, on every device, and the column
//! buffer it sizes.
//!
//! The CPU kernels unfold a batch item into im2col columns (`cin·kh·kw ×
//! oh·ow` elements per item: 110.25 MiB for VGG-16's second layer at 224²).
//! They need not hold a whole item's: [`ConvGeom::column_buffer_len`] caps
//! the buffer at the budget ([`DEFAULT_CONV_WORKSPACE_BYTES`] unless
//! [`with_conv_workspace`] says otherwise), and the kernels then work
//! through the item in pieces (whole groups, else positions or column rows
//! of one group; see `cpu/tiles.rs`) with the same values (bit for bit on
//! the f32 kernels, within rounding where the `gemm` crate multiplies, as
//! its depth blocking follows a product's shape). The CUDA kernels
//! gather their tiles from the input and need no columns, but hold a buffer
//! of the same size, so that the CPU, CUDA and meta ledgers agree byte for
//! byte. A weight gradient holds at least room for its split's partial sums
//! ([`ConvGeom::weight_grad_split`], the same on every device and at every
//! image size): the CUDA kernels sum a long reduction over few output tiles
//! in ranges of the batch, into as many partial sums as the budget holds.

use super::ConvGeom;
use crate::settings::{set, SettingGuard, CONV_WORKSPACE};
use crate::DType;
use std::cell::Cell;

pub use crate::settings::DEFAULT_CONV_WORKSPACE_BYTES;

/// A workspace budget for speed over memory (256 MiB): every layer of the
/// bundled models then unfolds whole items, and a CUDA weight gradient
/// splits its reduction further.
pub const LARGE_WORKSPACE_BYTES: usize = 256 << 20;

/// Blocks a weight gradient's split aims for (four per SM of a 132-SM
/// GPU: sixteen warps each, enough to hide the latency of their loads). A
/// constant, not a device's SM count, so that the split, and with it the
/// order of the sums, is the same on every device.
const SPLIT_TARGET_BLOCKS: usize = 528;
/// The output tile the split counts blocks in: the CUDA kernels' 64
/// columns by up to 64 rows (a taller tile is taken only where tiles are
/// many, and then no split is wanted either way).
pub(super) const SPLIT_TILE: usize = 64;
/// Fewest batch positions one split sums on average: no split is empty,
/// and a ResNet's splits are the same from 32² images up at batch 64 (its
/// last 1×1 layer then has 64 positions, enough for the 17 splits its 32
/// tiles want), so that a small run's launches are a large one's and
/// extrapolate to it.
const MIN_SPLIT_POSITIONS: usize = 2;
/// Most blocks a split launch may have: every split's block is then in
/// the grid at once (the kernels' grid is at most 65,536 blocks), so that
/// a split that waits for the one before it in its chain waits for an
/// earlier block, never for one that runs after it.
const MAX_SPLIT_BLOCKS: usize = 65_536;

/// How a weight gradient's reduction over the batch's positions is split
/// ([`ConvGeom::weight_grad_split`]): `splits` ranges of positions (range
/// `s` is `s·P/splits .. (s+1)·P/splits`), summed into `slots` partial
/// sums (range `s` into slot `s % slots`, each slot's ranges one after
/// another in order), which are then added in slot order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WeightGradSplit {
    /// Ranges of positions (1: no split, the kernel sums in place).
    pub splits: usize,
    /// Partial sums held (each `cout·cin/groups·kh·kw` values).
    pub slots: usize,
    /// Output tiles per split ([`SPLIT_TILE`] square; the kernels' tiles
    /// are never more): one chain counter each per slot.
    pub tiles: usize,
    /// Bytes of one partial sum (`cout·cin/groups·kh·kw` accumulators).
    pub sum_bytes: usize,
}

impl WeightGradSplit {
    /// Bytes of the chains' counters (one `u32` per slot and tile, only
    /// where a slot sums more than one range).
    pub(super) fn counter_bytes(&self) -> usize {
        match self.splits > self.slots {
            true => self.slots * self.tiles * 4,
            false => 0,
        }
    }

    /// Bytes of the slots' partial sums, which come first in the Workspace
    /// (the counters follow them).
    pub(super) fn sums_bytes(&self) -> usize {
        self.slots * self.sum_bytes
    }

    /// Bytes of Workspace the split needs: none without a split, else the
    /// partial sums and the counters.
    pub(super) fn room_bytes(&self) -> usize {
        match self.splits {
            1 => 0,
            _ => self.sums_bytes() + self.counter_bytes(),
        }
    }
}

/// Convolutions on this thread hold at most `bytes` of Workspace (or the
/// smallest piece they can work in, when that is more), on every device,
/// until the guard drops. The values do not depend on it beyond rounding
/// (f32 and bf16 on AVX2 or AVX-512: not at all).
pub fn with_conv_workspace(bytes: usize) -> SettingGuard<usize> {
    set(&CONV_WORKSPACE, bytes)
}

/// The convolution workspace budget on this thread now, in bytes.
pub fn conv_workspace_bytes() -> usize {
    CONV_WORKSPACE.with(Cell::get)
}

impl ConvGeom {
    /// The elements of one item's whole column matrix,
    /// `[groups, cin/groups·kh·kw, oh·ow]`.
    pub(super) fn full_columns(&self) -> usize {
        self.groups * self.k() * self.l()
    }

    /// The elements of `dtype` in a convolution's column buffer: one item's
    /// whole column matrix where the budget holds it, else as much as the
    /// budget holds but never less than three of one group's output
    /// positions (columns of `k`) or three column rows (of `oh·ow`): the
    /// CPU kernels' pieces are then never one long (see `cpu/tiles.rs`).
    pub(super) fn column_buffer_len(&self, dtype: DType) -> usize {
        let budget = conv_workspace_bytes() / dtype.size_in_bytes().max(1);
        let smallest = 3 * self.k().max(self.l());
        self.full_columns().min(budget.max(smallest))
    }

    /// How a weight gradient in `dtype` splits its reduction over the
    /// batch's `n·oh·ow` positions ([`WeightGradSplit`]): enough ranges
    /// for about [`SPLIT_TARGET_BLOCKS`] blocks over the output's tiles
    /// with [`MIN_SPLIT_POSITIONS`] positions each on average, and only as
    /// many partial sums (`cout·cin/groups·kh·kw` each, in f32 for the half
    /// types, as the kernels accumulate, with their chains' counters) as
    /// the workspace budget holds; none where it holds not even one.
    /// Nothing depends on the image size beyond the floor of positions.
    pub(super) fn weight_grad_split(&self, dtype: DType) -> WeightGradSplit {
        let tiles =
            self.groups * self.cout_g().div_ceil(SPLIT_TILE) * self.k().div_ceil(SPLIT_TILE);
        let sum_bytes = self.cout * self.k() * partial_bytes(dtype);
        let splits = SPLIT_TARGET_BLOCKS
            .div_ceil(tiles.max(1))
            .min(self.n * self.l() / MIN_SPLIT_POSITIONS)
            .min(MAX_SPLIT_BLOCKS / tiles.max(1));
        let slots = splits.min(conv_workspace_bytes() / (sum_bytes + 4 * tiles).max(1));
        let (splits, slots) = match splits > 1 && slots > 0 {
            true => (splits, slots),
            false => (1, 1),
        };
        WeightGradSplit {
            splits,
            slots,
            tiles,
            sum_bytes,
        }
    }

    /// The elements of `dtype` a weight gradient holds as Workspace: the
    /// column buffer, or room for its split's partial sums and counters
    /// where that is more (CUDA keeps them there; the CPU kernels use the
    /// column buffer's share and hold the rest only so that the ledgers
    /// agree).
    pub(super) fn weight_grad_workspace_len(&self, dtype: DType) -> usize {
        let room = self.weight_grad_split(dtype).room_bytes();
        self.column_buffer_len(dtype)
            .max(room.div_ceil(dtype.size_in_bytes()))
    }
}

/// Bytes of one partial sum of a weight gradient in `dtype`: f32 for the
/// half types (the kernels' accumulators), the dtype's own size otherwise.
fn partial_bytes(dtype: DType) -> usize {
    dtype.size_in_bytes().max(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(cin: usize, cout: usize, h: usize, groups: usize) -> ConvGeom {
        ConvGeom {
            n: 1,
            cin,
            h,
            w: h,
            cout,
            kh: 3,
            kw: 3,
            oh: h,
            ow: h,
            stride: [1, 1],
            pad: [1, 1],
            dil: [1, 1],
            groups,
        }
    }

    #[test]
    fn the_column_buffer_is_an_item_capped_by_the_budget_never_below_a_piece() {
        // VGG-16's second layer at 224²: 64·9 × 224² columns, capped.
        let vgg = geom(64, 64, 224, 1);
        assert_eq!(vgg.full_columns(), 576 * 50176);
        assert_eq!(vgg.column_buffer_len(DType::F32), 1 << 20);
        assert_eq!(vgg.column_buffer_len(DType::BF16), 2 << 20);
        // A small layer keeps its whole item.
        let small = geom(64, 64, 7, 1);
        assert_eq!(small.column_buffer_len(DType::F32), 576 * 49);
        {
            let _tiny = with_conv_workspace(1);
            assert_eq!(vgg.column_buffer_len(DType::F32), 3 * 50176);
            assert_eq!(small.column_buffer_len(DType::F32), 3 * 576);
            let _large = with_conv_workspace(LARGE_WORKSPACE_BYTES);
            assert_eq!(vgg.column_buffer_len(DType::F32), 576 * 50176);
        }
        assert_eq!(conv_workspace_bytes(), DEFAULT_CONV_WORKSPACE_BYTES);
        let other = std::thread::spawn(|| {
            let _tiny = with_conv_workspace(1);
            conv_workspace_bytes()
        });
        assert_eq!(other.join().unwrap(), 1);
        assert_eq!(conv_workspace_bytes(), DEFAULT_CONV_WORKSPACE_BYTES);
    }

    /// The weight gradient splits a long reduction over few tiles into
    /// enough ranges for the target's blocks, the same at every image size
    /// from 32² (the floor of positions aside), and sums them into as many
    /// partial sums as the budget holds.
    #[test]
    fn weight_grad_splits_within_the_budget_at_every_size() {
        // ResNet-18's first 3×3 layer at batch 64, 56²: 9 tiles, 64·576
        // partial sums per slot (147,456 bytes) and 9 counters.
        let g = ConvGeom {
            n: 64,
            ..geom(64, 64, 56, 1)
        };
        let per_slot = 64 * 576 * 4 + 9 * 4;
        // 528/9 → 59 ranges; 4 MiB / 147,492 → 28 partial sums.
        let split = g.weight_grad_split(DType::F32);
        assert_eq!((split.splits, split.slots, split.tiles), (59, 28, 9));
        assert_eq!(split.counter_bytes(), 28 * 9 * 4);
        // The column buffer holds them (1 Mi elements, capped by the budget).
        assert_eq!(g.weight_grad_workspace_len(DType::F32), 1 << 20);
        // The same split at 8² (ResNet-18's layer1 for 32² images), where
        // the partial sums are more than one item's columns.
        let small = ConvGeom {
            n: 64,
            ..geom(64, 64, 8, 1)
        };
        assert_eq!(small.weight_grad_split(DType::F32), split);
        let room = 28 * 64 * 576 * 4 + 28 * 9 * 4;
        assert_eq!(small.weight_grad_workspace_len(DType::F32), room / 4);
        // bf16 keeps f32 partial sums: the same split, twice the elements.
        assert_eq!(small.weight_grad_split(DType::BF16), split);
        assert_eq!(small.weight_grad_workspace_len(DType::BF16), room / 2);
        {
            // A budget for 3 partial sums: 3 slots of 59 ranges; for none:
            // no split.
            let _three = with_conv_workspace(3 * per_slot + 1);
            assert_eq!(g.weight_grad_split(DType::F32).slots, 3);
            assert_eq!(g.weight_grad_split(DType::F32).splits, 59);
            let _none = with_conv_workspace(per_slot - 1);
            assert_eq!(g.weight_grad_split(DType::F32).splits, 1);
        }
        // A budget for every range: one range per slot, no counters.
        {
            let _large = with_conv_workspace(LARGE_WORKSPACE_BYTES);
            let all = g.weight_grad_split(DType::F32);
            assert_eq!((all.splits, all.slots, all.counter_bytes()), (59, 59, 0));
        }
        // ResNet-18's last 1×1 layer (256 → 512, stride 2) at batch 64:
        // 32 tiles, 17 ranges into 7 slots from 32² images (1² outputs) up.
        for (size, out) in [(2, 1), (4, 2), (14, 7)] {
            let down = ConvGeom {
                n: 64,
                kh: 1,
                kw: 1,
                stride: [2, 2],
                pad: [0, 0],
                oh: out,
                ow: out,
                ..geom(256, 512, size, 1)
            };
            let split = down.weight_grad_split(DType::F32);
            assert_eq!((split.splits, split.slots), (17, 7), "{size}²");
        }
        // One position: nothing to split.
        let tiny = ConvGeom {
            n: 1,
            ..geom(64, 64, 1, 1)
        };
        assert_eq!(tiny.weight_grad_split(DType::F32).splits, 1);
        let columns = tiny.column_buffer_len(DType::F32);
        assert_eq!(tiny.weight_grad_workspace_len(DType::F32), columns);
    }
}
