//! Adversarial examples with PGD on a frozen ResNet-18: every parameter is
//! frozen and BatchNorm is in evaluation mode, so backward computes only the
//! image's gradient and the step keeps only what that gradient needs.
//!
//! ```sh
//! cargo run --release --example adversarial -- IMAGE_DIR [resnet18.safetensors]
//! cargo run --release --example adversarial     # synthetic images, random weights
//! ```
//!
//! The weights file is torchvision's state dict saved with
//! `safetensors.torch.save_file(torchvision.models.resnet18(weights="DEFAULT").state_dict(), "resnet18.safetensors")`.
//! The adversarial images are written next to the inputs' names under
//! `adversarial-out/`.

mod common;

use leangrad::autograd::{no_grad, with_save_policy, SavePolicy};
use leangrad::data::{
    normalize, read_image, write_png, CenterCrop, Compose, PngDepth, Resize, Transform,
    IMAGENET_MEAN, IMAGENET_STD,
};
use leangrad::io::{load_safetensors, load_state_dict, LoadOptions};
use leangrad::memory::Ledger;
use leangrad::models::{Freeze, ResNet, ResNetConfig};
use leangrad::nn::Module;
use leangrad::ops::CrossEntropyOptions;
use leangrad::{DType, Device, Error, Result, Tensor};
use std::path::{Path, PathBuf};

const EPS: f64 = 8.0 / 255.0;
const ALPHA: f64 = 2.0 / 255.0;
const STEPS: usize = 10;

fn main() -> Result<()> {
    // CPU ops run on a pool this thread is part of.
    leangrad::threads::init(None)?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (files, size) = match args.first() {
        Some(dir) => (images_in(&PathBuf::from(dir))?, 224),
        None => {
            println!("no image folder given: attacking 4 synthetic 64×64 images");
            let dir = common::scratch("adversarial");
            let colours = [("a", [0.8, 0.2, 0.2]), ("b", [0.2, 0.7, 0.3])];
            common::image_folder(&dir, &colours, 2, 64)?;
            (
                images_in(&dir.join("a"))?
                    .into_iter()
                    .chain(images_in(&dir.join("b"))?)
                    .collect(),
                64,
            )
        }
    };
    let device = Device::cuda_if_available(0);
    let mut model = ResNet::new(ResNetConfig::resnet18(1000), DType::F32, device, 0)?;
    match args.get(1) {
        Some(w) => {
            load_state_dict(&model, &load_safetensors(w)?, LoadOptions::default())?;
        }
        None => println!("no weights given: ResNet-18 is randomly initialised"),
    }
    model.freeze(&["*"])?; // no parameter gets a gradient
    model.set_training(false); // BatchNorm uses its running statistics

    let pre = Compose::new()
        .then(Resize::shorter(size))
        .then(CenterCrop::square(size));
    let images = files
        .iter()
        .map(|f| pre.apply_once(&read_image(f)?)?.unsqueeze(0))
        .collect::<Result<Vec<_>>>()?;
    let x = Tensor::cat(&images.iter().collect::<Vec<_>>(), 0)?.to_device(device)?;
    // The normalisation is part of the differentiated function, so the
    // perturbation lives in pixel units.
    let logits = |x: &Tensor| model.forward(&normalize(x, &IMAGENET_MEAN, &IMAGENET_STD)?);
    let clean = {
        let _g = no_grad();
        logits(&x)?.argmax(1, false)?
    };

    // One step's gradient, under a ledger of its own: what the step keeps
    // beyond the model's weights.
    let gradient = |adv: &Tensor| -> Result<(Tensor, f64, usize)> {
        let ledger = Ledger::new();
        let _in_step = ledger.enter();
        let adv = adv.detach().set_requires_grad(true)?;
        let loss = logits(&adv)?.cross_entropy(&clean, CrossEntropyOptions::default())?;
        loss.backward()?;
        let grad = adv
            .take_grad()
            .ok_or(Error::Backward("no gradient".into()))?;
        Ok((grad, loss.to_scalar()?, ledger.peak(device)))
    };

    // PGD in the L∞ ball: random start, then signed-gradient ascent steps,
    // each projected back into the ball and into [0, 1].
    let start = Tensor::rand_range(x.shape(), -EPS, EPS, DType::F32, device, 1)?;
    let mut adv = x.add(&start)?.clamp(0.0, 1.0)?;
    let mut step_bytes = 0;
    for step in 1..=STEPS {
        let (g, loss, bytes) = gradient(&adv)?;
        step_bytes = bytes;
        let _g = no_grad();
        let delta = adv
            .add(&g.sign()?.mul_scalar(ALPHA)?)?
            .sub(&x)?
            .clamp(-EPS, EPS)?;
        adv = x.add(&delta)?.clamp(0.0, 1.0)?;
        println!("step {step:2}: loss {loss:.4}");
    }
    let pytorch_bytes = {
        let _policy = with_save_policy(SavePolicy::SaveAll); // what PyTorch's autograd keeps
        gradient(&adv)?.2
    };

    let _g = no_grad();
    let before = clean.to_vec::<i64>()?;
    let after = logits(&adv)?.argmax(1, false)?.to_vec::<i64>()?;
    let flipped = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    let linf = adv
        .sub(&x)?
        .abs()?
        .to_vec::<f32>()?
        .into_iter()
        .fold(0f32, f32::max);
    let out = PathBuf::from("adversarial-out");
    std::fs::create_dir_all(&out).map_err(|e| Error::Image {
        path: out.clone(),
        reason: e.to_string(),
    })?;
    for (i, file) in files.iter().enumerate() {
        let name = file
            .file_stem()
            .map_or("image".into(), |s| s.to_string_lossy().into_owned());
        let path = out.join(format!("{}-{name}.png", i));
        write_png(&adv.narrow(0, i, 1)?, &path, PngDepth::Eight)?;
    }
    println!(
        "predictions changed on {flipped} of {} images; max |δ| = {linf:.5} (eps {EPS:.5})",
        files.len()
    );
    println!(
        "one attack step: {:.1} MiB (PyTorch's autograd keeps {:.1} MiB); images in {}",
        step_bytes as f64 / 1048576.0,
        pytorch_bytes as f64 / 1048576.0,
        out.display()
    );
    Ok(())
}

/// The image files directly in `dir`, sorted.
fn images_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let files = leangrad::jobs::image_files(dir)?;
    Ok(files.into_iter().map(|(path, _)| path).collect())
}
