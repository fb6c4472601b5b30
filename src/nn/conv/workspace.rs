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
//! of the same size (their weight gradient keeps its split partial sums
//! there), so that the CPU, CUDA and meta ledgers agree byte for byte.

use super::ConvGeom;
use crate::settings::{set, SettingGuard};
use crate::DType;
use std::cell::Cell;

/// The Workspace a convolution may hold by default (4 MiB), as PyTorch
/// bounds cuDNN's: enough for the CPU's products to run whole tiles on
/// every layer of the bundled models, a small part of any step's peak.
pub const DEFAULT_CONV_WORKSPACE_BYTES: usize = 4 << 20;

/// A workspace budget for speed over memory (256 MiB): every layer of the
/// bundled models then unfolds whole items, and a CUDA weight gradient
/// splits its reduction further.
pub const LARGE_WORKSPACE_BYTES: usize = 256 << 20;

thread_local! {
    static CONV_WORKSPACE: Cell<usize> = const { Cell::new(DEFAULT_CONV_WORKSPACE_BYTES) };
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
}
