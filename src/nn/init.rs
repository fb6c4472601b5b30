//! Parameter initialisations as `torch.nn.init`'s (`uniform_`, `normal_`,
//! `kaiming_normal_`, `constant_`), drawn from leangrad's Philox streams.
//!
//! A layer builder takes an [`Init`] for its weight and bias
//! (`Conv2d::builder(64, 64, 3).weight_init(Init::kaiming_normal_relu(FanMode::FanOut))`);
//! without one it keeps PyTorch's per-layer default. The models use these
//! to initialise as torchvision's and Hugging Face's constructors do.
//!
//! Element `i` of a drawn tensor depends only on (seed, `i`): uniform
//! element `i` is `low + (high − low)·u` with `u` word `i` of the uniform
//! stream ([`crate::rng::uniform_at`]), normal element `i` is
//! `mean + std·z` with `z` element `i` of the normal stream
//! ([`crate::rng::normal_at`]), computed in f64 and rounded once to the
//! dtype. So the values do not depend on the thread count (large tensors
//! are filled by rayon's threads), and are the same on every device: CUDA
//! parameters are drawn on the host and uploaded. The meta device holds no
//! data and draws nothing.

use crate::dtype::{CpuData, WithDType};
use crate::rng::philox4x32_10;
use crate::{DType, Device, Error, Result, Tensor};
use rayon::prelude::*;

/// Which fan `kaiming_normal_` divides by, as torch's `mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanMode {
    /// Inputs per output: keeps the forward activations' variance.
    FanIn,
    /// Outputs per input: keeps the backward gradients' variance
    /// (torchvision's CNNs).
    FanOut,
}

/// `torch.nn.init.calculate_gain("relu")`, also kaiming's default gain
/// (leaky ReLU with slope 0): √2.
pub const RELU_GAIN: f64 = std::f64::consts::SQRT_2;

/// How a parameter is first filled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Uniform in `[low, high)` (`uniform_`). PyTorch's Linear and
    /// convolutions default to ±1/√fan_in for weight and bias.
    Uniform {
        /// Lower bound (included).
        low: f64,
        /// Upper bound (excluded).
        high: f64,
    },
    /// Normal with `mean` and standard deviation `std` (`normal_`).
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation (not negative).
        std: f64,
    },
    /// `kaiming_normal_`: N(0, (gain/√fan)²), the fan computed from the
    /// tensor's shape as torch does (see [`fans`]).
    KaimingNormal {
        /// Fan in or fan out.
        mode: FanMode,
        /// The nonlinearity's gain ([`RELU_GAIN`] for ReLU).
        gain: f64,
    },
    /// Every element `value` (`constant_`, `zeros_`, `ones_`).
    Constant(f64),
}

impl Init {
    /// `kaiming_normal_(mode=…, nonlinearity="relu")`, as torchvision
    /// initialises the convolutions of ResNet, VGG and MobileNetV2.
    pub fn kaiming_normal_relu(mode: FanMode) -> Init {
        Init::KaimingNormal {
            mode,
            gain: RELU_GAIN,
        }
    }

    /// Normal with mean 0 and standard deviation `std`.
    pub fn normal(std: f64) -> Init {
        Init::Normal { mean: 0.0, std }
    }

    /// Zeros.
    pub fn zeros() -> Init {
        Init::Constant(0.0)
    }

    /// A new tensor of `shape` filled as `self` says, from the Philox
    /// stream `seed` (not yet a parameter). An invalid init (a negative or
    /// non-finite spread, bounds out of order, a fan of a tensor of rank
    /// below 2 or with no elements) is [`Error::InvalidArgument`].
    pub fn tensor(
        self,
        shape: &[usize],
        dtype: DType,
        device: Device,
        seed: u64,
    ) -> Result<Tensor> {
        self.tensor_for("init", shape, None, (dtype, device), seed)
    }

    /// [`Init::tensor`] for the layer `op`, with row `zero_row` of a 2-d
    /// tensor set to zero afterwards (an embedding's padding row).
    pub(crate) fn tensor_for(
        self,
        op: &'static str,
        shape: &[usize],
        zero_row: Option<usize>,
        (dtype, device): (DType, Device),
        seed: u64,
    ) -> Result<Tensor> {
        let spread = self.spread(op, shape)?;
        if let Some(row) = zero_row {
            if shape.len() != 2 || row >= shape[0] {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!("row {row} to zero is outside the table {shape:?}"),
                });
            }
        }
        if device.is_meta() {
            return Tensor::new_meta(shape, dtype);
        }
        let n = crate::tensor::checked_numel(op, shape)?;
        if let (Spread::Constant(v), None) = (spread, zero_row) {
            return Tensor::full(shape, v, dtype, device);
        }
        let mut data = CpuData::for_overwrite(dtype, n)?;
        crate::match_cpu_data!(&mut data, v => fill(v, spread, seed));
        if let Some(row) = zero_row {
            let cols = shape[1];
            crate::match_cpu_data!(&mut data, v => {
                let zero = crate::dtype::from_f64_like(v, 0.0);
                v[row * cols..(row + 1) * cols].fill(zero);
            });
        }
        Tensor::from_data_on(data, shape, device)
    }

    /// What the fill draws, with the checks of its arguments.
    fn spread(self, op: &'static str, shape: &[usize]) -> Result<Spread> {
        let bad = |msg: String| Err(Error::InvalidArgument { op, msg });
        match self {
            Init::Uniform { low, high } if low.is_finite() && high.is_finite() && low <= high => {
                Ok(Spread::Uniform { low, high })
            }
            Init::Uniform { low, high } => {
                bad(format!("uniform bounds [{low}, {high}) are invalid"))
            }
            Init::Normal { mean, std } if mean.is_finite() && std.is_finite() && std >= 0.0 => {
                Ok(Spread::Normal { mean, std })
            }
            Init::Normal { mean, std } => bad(format!("normal mean {mean}, std {std} are invalid")),
            Init::KaimingNormal { mode, gain } => {
                let (fan_in, fan_out) = fans_for(op, shape)?;
                let fan = match mode {
                    FanMode::FanIn => fan_in,
                    FanMode::FanOut => fan_out,
                };
                if !gain.is_finite() || fan == 0 {
                    return bad(format!("kaiming gain {gain} over fan {fan} of {shape:?}"));
                }
                let std = gain / (fan as f64).sqrt();
                Ok(Spread::Normal { mean: 0.0, std })
            }
            Init::Constant(v) if v.is_finite() => Ok(Spread::Constant(v)),
            Init::Constant(v) => bad(format!("constant {v} is not finite")),
        }
    }
}

/// `(fan_in, fan_out)` of a weight of `shape`, as torch's
/// `_calculate_fan_in_and_fan_out`: dimension 1 resp. 0 times the product
/// of the dimensions past 1 (a convolution's kernel). A shape of rank below
/// 2 has none: [`Error::InvalidArgument`].
pub fn fans(shape: &[usize]) -> Result<(usize, usize)> {
    fans_for("fans", shape)
}

fn fans_for(op: &'static str, shape: &[usize]) -> Result<(usize, usize)> {
    if shape.len() < 2 {
        return Err(Error::InvalidArgument {
            op,
            msg: format!("fan in and fan out need a shape of rank 2 or more, not {shape:?}"),
        });
    }
    let receptive = crate::tensor::checked_numel(op, &shape[2..])?;
    let fan = |d: usize| {
        d.checked_mul(receptive)
            .ok_or_else(|| Error::InvalidArgument {
                op,
                msg: format!("the fans of {shape:?} overflow"),
            })
    };
    Ok((fan(shape[1])?, fan(shape[0])?))
}

/// A checked [`Init`] reduced to what the fill draws.
#[derive(Clone, Copy, Debug)]
enum Spread {
    Uniform { low: f64, high: f64 },
    Normal { mean: f64, std: f64 },
    Constant(f64),
}

/// Below this many elements a tensor is filled on the calling thread.
const PARALLEL_MIN: usize = 1 << 16;
/// Elements per rayon task (a multiple of 4, so a task starts on a block).
const CHUNK: usize = 1 << 14;

/// Fills `out` with element `i` of `spread` drawn from stream `seed`.
fn fill<T: WithDType>(out: &mut [T], spread: Spread, seed: u64) {
    let chunk = |(c, part): (usize, &mut [T])| fill_from(part, c * CHUNK, spread, seed);
    if out.len() < PARALLEL_MIN {
        chunk((0, out));
    } else {
        out.par_chunks_mut(CHUNK).enumerate().for_each(chunk);
    }
}

/// Fills `out` with elements `start..start + out.len()` (`start` a
/// multiple of 4).
fn fill_from<T: WithDType>(out: &mut [T], start: usize, spread: Spread, seed: u64) {
    match spread {
        Spread::Uniform { low, high } => {
            // One Philox block gives four consecutive uniforms
            // (`rng::uniform_at`: word j % 4 of block j / 4).
            for (q, quad) in out.chunks_mut(4).enumerate() {
                let w = block(seed, ((start / 4) + q) as u64);
                for (o, x) in quad.iter_mut().zip(w) {
                    *o = T::from_f64(low + (high - low) * crate::rng::u32_to_unit_f64(x));
                }
            }
        }
        Spread::Normal { mean, std } => {
            // One Philox block gives two consecutive normals
            // (`rng::normal_at`: words 0, 1 for even j, 2, 3 for odd j).
            for (p, pair) in out.chunks_mut(2).enumerate() {
                let [z0, z1] = normal_pair(seed, ((start / 2) + p) as u64);
                pair[0] = T::from_f64(mean + std * z0);
                if let Some(o) = pair.get_mut(1) {
                    *o = T::from_f64(mean + std * z1);
                }
            }
        }
        Spread::Constant(v) => out.fill(T::from_f64(v)),
    }
}

/// Block `k` of the Philox stream for `seed`, as `rng` numbers them.
fn block(seed: u64, k: u64) -> [u32; 4] {
    philox4x32_10(
        [k as u32, (k >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// Elements `2k` and `2k + 1` of the normal stream for `seed`, equal to
/// [`crate::rng::normal_at`] of each (one Philox block for both).
fn normal_pair(seed: u64, k: u64) -> [f64; 2] {
    let w = block(seed, k);
    [box_muller(w[0], w[1]), box_muller(w[2], w[3])]
}

/// One standard normal from two random words, as `rng::normal_at`: the
/// first word's `(x + 1) / 2^24` lies in (0, 1], so the log is finite.
fn box_muller(a: u32, b: u32) -> f64 {
    let u1 = ((a >> 8) as f64 + 1.0) / 16_777_216.0;
    let u2 = (b >> 8) as f64 / 16_777_216.0;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{normal_at, uniform_at};

    fn values(t: &Tensor) -> Vec<f64> {
        t.to_f64_vec().unwrap()
    }

    #[test]
    fn draws_are_the_rng_streams_element_for_element_in_parallel_too() {
        // Odd length past the parallel threshold: chunks and the last pair.
        let n = PARALLEL_MIN + 2 * CHUNK + 3;
        let normal = Init::Normal {
            mean: 0.5,
            std: 0.25,
        };
        let t = normal.tensor(&[n], DType::F64, Device::Cpu, 7).unwrap();
        let v = values(&t);
        for i in [0, 1, 2, CHUNK - 1, CHUNK, CHUNK + 1, n - 2, n - 1] {
            assert_eq!(v[i], 0.5 + 0.25 * normal_at(7, i as u64), "element {i}");
        }
        let uniform = Init::Uniform {
            low: -2.0,
            high: 3.0,
        };
        let u = values(&uniform.tensor(&[n], DType::F64, Device::Cpu, 9).unwrap());
        let old = values(&Tensor::rand_range(&[n], -2.0, 3.0, DType::F64, Device::Cpu, 9).unwrap());
        assert_eq!(u, old);
        assert!((u[n - 1] - (-2.0 + 5.0 * uniform_at(9, (n - 1) as u64))).abs() == 0.0);
    }

    #[test]
    fn kaiming_normal_uses_torchs_fans() {
        assert_eq!(fans(&[64, 3, 7, 7]).unwrap(), (3 * 49, 64 * 49));
        assert_eq!(fans(&[10, 512]).unwrap(), (512, 10));
        assert!(fans(&[5]).is_err());
        let shape = [8, 2, 3, 3];
        let k = Init::kaiming_normal_relu(FanMode::FanOut);
        let t = values(&k.tensor(&shape, DType::F64, Device::Cpu, 3).unwrap());
        let std = (2.0f64 / (8.0 * 9.0)).sqrt();
        for (i, x) in t.iter().enumerate() {
            assert!((x - std * normal_at(3, i as u64)).abs() < 1e-15, "{i}");
        }
        let bias =
            Init::kaiming_normal_relu(FanMode::FanIn).tensor(&[4], DType::F32, Device::Cpu, 0);
        assert!(
            matches!(bias, Err(Error::InvalidArgument { .. })),
            "{bias:?}"
        );
    }

    #[test]
    fn constants_zero_rows_and_bad_arguments() {
        let c = Init::Constant(1.5)
            .tensor(&[2, 3], DType::BF16, Device::Cpu, 0)
            .unwrap();
        assert_eq!(values(&c), vec![1.5; 6]);
        let padded = Init::normal(1.0)
            .tensor_for("t", &[3, 2], Some(1), (DType::F32, Device::Cpu), 4)
            .unwrap();
        let v = values(&padded);
        assert_eq!(&v[2..4], &[0.0, 0.0]);
        assert_eq!(v[0], normal_at(4, 0) as f32 as f64);
        assert_eq!(v[5], normal_at(4, 5) as f32 as f64);
        let outside =
            Init::normal(1.0).tensor_for("t", &[3, 2], Some(3), (DType::F32, Device::Cpu), 4);
        assert!(outside.is_err());
        for bad in [
            Init::normal(-1.0),
            Init::normal(f64::NAN),
            Init::Uniform {
                low: 1.0,
                high: 0.0,
            },
            Init::Constant(f64::INFINITY),
        ] {
            let r = bad.tensor(&[2, 2], DType::F32, Device::Cpu, 0);
            assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{bad:?}");
        }
    }

    #[test]
    fn the_meta_device_gets_a_dataless_tensor() {
        let t = Init::normal(1.0)
            .tensor(&[1 << 20, 1 << 10], DType::F32, Device::Meta, 0)
            .unwrap();
        assert_eq!(t.shape(), &[1 << 20, 1 << 10]);
        assert!(t.device().is_meta());
    }
}
