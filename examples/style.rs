//! Neural style transfer (Gatys et al.) on VGG-19's features with L-BFGS:
//! the network is frozen, the content features and style Gram matrices are
//! computed once, and the image is the only tensor that requires grad.
//!
//! ```sh
//! cargo run --release --example style -- CONTENT.png STYLE.png [vgg19.safetensors]
//! cargo run --release --example style     # synthetic 64×64 images, random VGG-19
//! ```
//!
//! The result is written to `styled.png`. Real results need torchvision's
//! pretrained VGG-19 (`safetensors.torch.save_file(torchvision.models.vgg19(weights="DEFAULT").state_dict(), "vgg19.safetensors")`).

mod common;

use leangrad::autograd::no_grad;
use leangrad::data::{
    normalize, read_image, write_png, Compose, PngDepth, Resize, Transform, IMAGENET_MEAN,
    IMAGENET_STD,
};
use leangrad::io::{load_safetensors, load_state_dict, LoadOptions};
use leangrad::memory::{Category, Ledger};
use leangrad::models::{FeatureMaps, Freeze, Vgg, VggConfig};
use leangrad::nn::Module;
use leangrad::ops::Reduction;
use leangrad::optim::{Lbfgs, LbfgsOptions};
use leangrad::{DType, Device, Result, Tensor};

/// conv1_1 … conv5_1, then conv4_2 (torchvision's indices in `features`).
const STYLE_LAYERS: [&str; 5] = [
    "features.0",
    "features.5",
    "features.10",
    "features.19",
    "features.28",
];
const CONTENT_LAYER: &str = "features.21";
const STYLE_WEIGHT: f64 = 1e6;
const STEPS: usize = 30;

/// `F·Fᵀ / (C·H·W)` of feature maps `[1, C, H, W]`.
fn gram(maps: &Tensor) -> Result<Tensor> {
    let s = maps.shape().to_vec();
    let f = maps.reshape(&[s[1], s[2] * s[3]])?;
    f.matmul(&f.t()?)?.div_scalar((s[1] * s[2] * s[3]) as f64)
}

fn main() -> Result<()> {
    // CPU ops run on a pool this thread is part of.
    leangrad::threads::init(None)?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let device = Device::cuda_if_available(0);
    let (content, style) = match (args.first(), args.get(1)) {
        (Some(c), Some(s)) => {
            let pre = Compose::new().then(Resize::shorter(256));
            (
                pre.apply_once(&read_image(c)?)?,
                pre.apply_once(&read_image(s)?)?,
            )
        }
        _ => {
            println!("no images given: synthetic 64×64 content and style images");
            (
                common::noisy_image([0.6, 0.5, 0.4], 64, 1)?,
                common::noisy_image([0.1, 0.3, 0.9], 64, 2)?,
            )
        }
    };
    let (content, style) = (
        content.unsqueeze(0)?.to_device(device)?,
        style.unsqueeze(0)?.to_device(device)?,
    );

    let mut vgg = Vgg::new(&VggConfig::vgg19(false, 1000), DType::F32, device, 0)?;
    match args.get(2) {
        Some(w) => {
            load_state_dict(&vgg, &load_safetensors(w)?, LoadOptions::default())?;
        }
        None => println!("no weights given: VGG-19 is randomly initialised"),
    }
    vgg.freeze(&["*"])?;
    vgg.set_training(false);
    let mut layers = STYLE_LAYERS.to_vec();
    layers.push(CONTENT_LAYER);
    // Feature maps of [1, 3, H, W] images in [0, 1]; only the layers up to
    // conv5_1 run.
    let maps = |x: &Tensor| -> Result<Vec<Tensor>> {
        let x = normalize(x, &IMAGENET_MEAN, &IMAGENET_STD)?;
        Ok(vgg
            .features(&x, &layers)?
            .into_iter()
            .map(|(_, t)| t)
            .collect())
    };
    let (style_grams, content_target) = {
        let _g = no_grad();
        let grams = maps(&style)?[..5]
            .iter()
            .map(gram)
            .collect::<Result<Vec<_>>>()?;
        (grams, maps(&content)?.remove(5))
    };

    let ledger = Ledger::new();
    let _counted = ledger.enter();
    let image = content.detach().contiguous()?.set_requires_grad(true)?; // start from the content
    let mut lbfgs = Lbfgs::new([image.clone()], LbfgsOptions::new(1.0).max_iter(1))?;
    let loss_of = |image: &Tensor| -> Result<Tensor> {
        let m = maps(image)?;
        let mut loss = m[5].mse_loss(&content_target, Reduction::Mean)?;
        for (f, target) in m[..5].iter().zip(&style_grams) {
            loss = loss.add(
                &gram(f)?
                    .mse_loss(target, Reduction::Mean)?
                    .mul_scalar(STYLE_WEIGHT)?,
            )?;
        }
        Ok(loss)
    };
    for step in 1..=STEPS {
        let loss = lbfgs.step(|| {
            let loss = loss_of(&image)?;
            loss.backward()?;
            loss.to_scalar()
        })?;
        if step == 1 || step % 10 == 0 {
            println!("step {step:3}: loss {loss:.4e}");
        }
    }
    // Clamped to [0, 1] only when written: clamping between steps would
    // break the curvature pairs L-BFGS keeps.
    write_png(&image.clamp(0.0, 1.0)?, "styled.png", PngDepth::Eight)?;
    let mib = |b: usize| b as f64 / 1048576.0;
    println!(
        "wrote styled.png; step peak {:.1} MiB beyond the weights (saved for backward {:.1} MiB, L-BFGS history {:.1} MiB)",
        mib(ledger.peak(device)),
        mib(ledger.peak_in(device, Category::Saved)),
        mib(ledger.peak_in(device, Category::OptimizerState)),
    );
    Ok(())
}
