//! The image transforms and the data loader with CUDA tensors, against the
//! CPU: normalize/denormalize, flips and crops run as tensor ops on the
//! device; resize computes on the host and returns to the device; a loader
//! hands its batches over on the device. Without a GPU the test prints
//! `skipped: no CUDA device (…)` and passes.

mod cuda_common;

use leangrad::data::{
    center_crop, denormalize, hflip, normalize, resize, DataLoader, Dataset, SampleRng,
    IMAGENET_MEAN, IMAGENET_STD,
};
use leangrad::{DType, Device, Result, Tensor};

fn same(what: &str, cpu: &Tensor, cuda: &Tensor) {
    assert_eq!(cuda.device(), Device::Cuda(0), "{what}: device");
    assert_eq!(cpu.shape(), cuda.shape(), "{what}: shape");
    assert_eq!(
        cpu.to_vec::<f32>().unwrap(),
        cuda.to_vec::<f32>().unwrap(),
        "{what}"
    );
}

#[test]
fn transforms_on_cuda_match_the_cpu() {
    let _dev = cuda_or_skip!("data transforms");
    let dev = Device::Cuda(0);
    let x = Tensor::rand(&[2, 3, 9, 13], DType::F32, Device::Cpu, 7).unwrap();
    let xd = x.to_device(dev).unwrap();
    let (m, s) = (&IMAGENET_MEAN, &IMAGENET_STD);
    same(
        "normalize",
        &normalize(&x, m, s).unwrap(),
        &normalize(&xd, m, s).unwrap(),
    );
    same(
        "denormalize",
        &denormalize(&x, m, s).unwrap(),
        &denormalize(&xd, m, s).unwrap(),
    );
    same("hflip", &hflip(&x).unwrap(), &hflip(&xd).unwrap());
    same(
        "center_crop",
        &center_crop(&x, 5, 6).unwrap().contiguous().unwrap(),
        &center_crop(&xd, 5, 6).unwrap().contiguous().unwrap(),
    );
    same(
        "resize",
        &resize(&x, 4, 17).unwrap(),
        &resize(&xd, 4, 17).unwrap(),
    );
}

/// Sample `i`: a 3×4×4 image of `i`, label `i % 2`.
struct Constant;

impl Dataset for Constant {
    fn len(&self) -> usize {
        5
    }

    fn sample(&self, index: usize, _: &mut SampleRng) -> Result<(Tensor, usize)> {
        let image = Tensor::full(&[3, 4, 4], index as f64, DType::F32, Device::Cpu)?;
        Ok((image, index % 2))
    }
}

#[test]
fn loader_batches_arrive_on_cuda() {
    let _dev = cuda_or_skip!("data loader");
    let loader = DataLoader::new(Constant, 2)
        .unwrap()
        .device(Device::Cuda(0));
    let mut labels = Vec::new();
    for batch in loader.epoch(0) {
        let batch = batch.unwrap();
        assert_eq!(batch.images.device(), Device::Cuda(0));
        assert_eq!(batch.labels.device(), Device::Cuda(0));
        let pixels = batch.images.to_vec::<f32>().unwrap();
        for (k, &i) in batch.indices.iter().enumerate() {
            assert!(pixels[k * 48..(k + 1) * 48].iter().all(|&v| v == i as f32));
        }
        labels.extend(batch.labels.to_vec::<i64>().unwrap());
    }
    assert_eq!(labels, [0, 1, 0, 1, 0]);
}
