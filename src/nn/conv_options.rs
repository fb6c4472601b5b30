//! Options of the convolutions (stride, padding, dilation, groups), with
//! PyTorch's defaults.

/// Options of [`conv2d`](super::conv2d) (PyTorch's defaults: stride 1, no padding,
/// dilation 1, one group), per axis `[height, width]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// Step between output positions.
    pub stride: [usize; 2],
    /// Zeros added on both sides of the input.
    pub padding: [usize; 2],
    /// Spacing between kernel taps.
    pub dilation: [usize; 2],
    /// Channel groups (`groups == in_channels` is a depthwise convolution).
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Options of [`conv1d`](super::conv1d) (PyTorch's defaults: stride 1, no padding,
/// dilation 1, one group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dOptions {
    /// Step between output positions.
    pub stride: usize,
    /// Zeros added on both sides of the input.
    pub padding: usize,
    /// Spacing between kernel taps.
    pub dilation: usize,
    /// Channel groups.
    pub groups: usize,
}

impl Default for Conv1dOptions {
    fn default() -> Self {
        Conv1dOptions {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

/// Options of [`conv_transpose2d`](super::conv_transpose2d), per axis `[height, width]` (PyTorch's
/// defaults: stride 1, no padding or output padding, dilation 1, one group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dOptions {
    /// Step between input positions in the output.
    pub stride: [usize; 2],
    /// Removed from both sides of the full output.
    pub padding: [usize; 2],
    /// Added to one side of the output (must be below stride or dilation).
    pub output_padding: [usize; 2],
    /// Spacing between kernel taps.
    pub dilation: [usize; 2],
    /// Channel groups.
    pub groups: usize,
}

impl Default for ConvTranspose2dOptions {
    fn default() -> Self {
        ConvTranspose2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            output_padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}
