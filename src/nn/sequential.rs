//! `torch.nn.Sequential`: layers run one after the other, named by their
//! position.

use super::{BatchStatsSync, LayerKind, Module};
use crate::{Result, Tensor};
use std::sync::Arc;

/// Layers applied in order, as `torch.nn.Sequential`: child `i` is named
/// `"i"`, so its parameters are `i.weight`, `i.bias`, … in the state dict
/// (`0.weight`, `2.bias` for `Linear, ReLU, Linear`), exactly PyTorch's
/// names. Saves for backward what its children save.
///
/// ```
/// use leangrad::nn::{Linear, Module, ReLU, Sequential};
/// use leangrad::{DType, Device, Tensor};
///
/// let mlp = Sequential::new()
///     .with(Linear::builder(4, 8).seed(1).build(&Device::Cpu)?)
///     .with(ReLU { inplace: false })
///     .with(Linear::builder(8, 3).seed(2).build(&Device::Cpu)?);
/// let names: Vec<String> = mlp.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
/// let y = mlp.forward(&Tensor::randn(&[2, 4], DType::F32, Device::Cpu, 0)?)?;
/// assert_eq!(y.shape(), &[2, 3]);
/// # Ok::<(), leangrad::Error>(())
/// ```
#[derive(Default)]
pub struct Sequential {
    children: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty container (its forward returns the input).
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// The container with `layer` appended (builder style).
    pub fn with(mut self, layer: impl Module + 'static) -> Sequential {
        self.push(layer);
        self
    }

    /// Appends `layer`; it is named by its position (`len()` before the
    /// push).
    pub fn push(&mut self, layer: impl Module + 'static) {
        self.children.push(Box::new(layer));
    }

    /// Appends an already boxed layer.
    pub fn push_boxed(&mut self, layer: Box<dyn Module>) {
        self.children.push(layer);
    }

    /// Number of children.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether there are no children.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Child `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<&dyn Module> {
        self.children.get(index).map(|b| b.as_ref())
    }

    /// Child `index`, mutably (e.g. to switch it to evaluation mode).
    pub fn get_mut(&mut self, index: usize) -> Option<&mut (dyn Module + 'static)> {
        self.children.get_mut(index).map(|b| b.as_mut())
    }

    /// Replaces child `index` with `layer` (PyTorch's `seq[i] = layer`);
    /// returns the old one, or gives `layer` back when there is no child
    /// `index`.
    pub fn replace(
        &mut self,
        index: usize,
        layer: Box<dyn Module>,
    ) -> std::result::Result<Box<dyn Module>, Box<dyn Module>> {
        match self.children.get_mut(index) {
            Some(slot) => Ok(std::mem::replace(slot, layer)),
            None => Err(layer),
        }
    }

    /// The children in order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Module> {
        self.children.iter().map(|b| b.as_ref())
    }

    /// `(name, item)` for every child's items, prefixed with its index.
    fn prefixed<T>(&self, items: impl Fn(&dyn Module) -> Vec<(String, T)>) -> Vec<(String, T)> {
        self.children
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                items(c.as_ref())
                    .into_iter()
                    .map(move |(n, t)| (format!("{i}.{n}"), t))
            })
            .collect()
    }
}

impl std::ops::Index<usize> for Sequential {
    type Output = dyn Module;

    /// Child `index`; panics when out of range, as slice indexing does
    /// (use [`Sequential::get`] for a checked access).
    fn index(&self, index: usize) -> &Self::Output {
        self.children[index].as_ref()
    }
}

impl Module for Sequential {
    /// Each child's forward on the previous one's output.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for child in &self.children {
            h = child.forward(&h)?;
        }
        Ok(h)
    }

    /// Each child's `forward_owned` on the previous one's output, so that
    /// every child that can reuse its input's buffer does.
    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        let mut h = x;
        for child in &self.children {
            h = child.forward_owned(h)?;
        }
        Ok(h)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.prefixed(|c| c.named_parameters())
    }

    fn parameter_kinds(&self) -> Vec<(String, LayerKind)> {
        self.prefixed(|c| c.parameter_kinds())
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.prefixed(|c| c.named_buffers())
    }

    fn set_training(&mut self, training: bool) {
        for child in &mut self.children {
            child.set_training(training);
        }
    }

    fn sync_batch_norm(&mut self, sync: Option<&Arc<dyn BatchStatsSync>>) -> usize {
        self.children
            .iter_mut()
            .map(|c| c.sync_batch_norm(sync))
            .sum()
    }
}
