//! `gradient_checkpointing(true)` on every model that has it: the loss and
//! every gradient bit for bit those without it; the memory planner's step
//! with `checkpoint` predicted on the meta device byte for byte as the CPU
//! runs it, and below the step without checkpointing.
use leangrad::memory_plan::{run_step, OptimizerKind, StepInput, StepModel, StepSpec};
use leangrad::models::{Bert, BertConfig, Gpt2, Gpt2Config, ResNet, ResNetConfig, ViT};
use leangrad::models::{BertClassifier, ViTConfig};
use leangrad::nn::Module;
use leangrad::ops::CrossEntropyOptions;
use leangrad::{DType, Device, Result, Tensor};

const CPU: Device = Device::Cpu;

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// The loss and the gradients of the input (when it is a float tensor)
/// and of every parameter, in bits.
fn step(
    model: &dyn Module,
    input: &Tensor,
    loss: &dyn Fn(&Tensor) -> Result<Tensor>,
) -> Vec<Vec<u32>> {
    let l = loss(input).unwrap();
    l.backward().unwrap();
    let mut out = vec![bits(&l)];
    if input.requires_grad() {
        out.push(bits(&input.grad().unwrap()));
    }
    // A parameter the loss does not reach (the word embeddings of a model
    // given embeddings) has no gradient either way.
    for (_, p) in model.named_parameters() {
        out.push(p.grad().map_or_else(Vec::new, |g| bits(&g)));
    }
    out
}

fn ids(n: usize, l: usize, vocab: usize) -> Tensor {
    let v: Vec<i64> = (0..n * l).map(|i| ((i * 7 + 3) % vocab) as i64).collect();
    Tensor::from_vec(v, &[n, l], CPU).unwrap()
}

#[test]
fn gpt2_blocks_checkpointed_give_the_same_gradients() {
    let run = |on: bool| {
        let mut m = Gpt2::new(Gpt2Config::tiny(), DType::F32, CPU, 5).unwrap();
        m.gradient_checkpointing(on);
        assert_eq!(m.is_gradient_checkpointing(), on);
        let x = ids(2, 8, Gpt2Config::tiny().vocab_size);
        let targets = ids(2 * 8, 1, Gpt2Config::tiny().vocab_size)
            .reshape(&[16])
            .unwrap();
        step(&m, &x, &|x| {
            m.lm_loss(
                leangrad::models::TextInput::Ids(x),
                &targets,
                CrossEntropyOptions::default(),
            )
        })
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn bert_layers_checkpointed_with_a_padding_mask_give_the_same_gradients() {
    let run = |on: bool| {
        let mut m = Bert::new(BertConfig::tiny(), DType::F32, CPU, 5).unwrap();
        m.gradient_checkpointing(on);
        // Input embeddings requiring grad: the input gradient too.
        let x = Tensor::randn(&[2, 6, 16], DType::F32, CPU, 8)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let mask =
            Tensor::from_vec(vec![1i64, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1], &[2, 6], CPU).unwrap();
        step(&m, &x, &|x| {
            let (h, pooled) = m
                .encode_masked(leangrad::models::TextInput::Embeds(x), None, Some(&mask))
                .unwrap();
            h.square()?.mean_all()?.add(&pooled.unwrap().sum_all()?)
        })
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn vit_layers_checkpointed_give_the_same_gradients() {
    let run = |on: bool| {
        let mut m = ViT::new(ViTConfig::tiny(), DType::F32, CPU, 5).unwrap();
        m.gradient_checkpointing(on);
        let c = ViTConfig::tiny();
        let x = Tensor::randn(
            &[2, c.num_channels, c.image_size, c.image_size],
            DType::F32,
            CPU,
            9,
        )
        .unwrap();
        step(&m, &x, &|x| m.encode(x)?.0.square()?.mean_all())
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn resnet_blocks_checkpointed_in_train_mode_give_the_same_gradients_and_statistics() {
    let config = ResNetConfig {
        base_width: 4,
        num_classes: 5,
        ..ResNetConfig::resnet50(5)
    };
    let run = |on: bool| {
        let mut m = ResNet::new(config, DType::F32, CPU, 3).unwrap();
        m.gradient_checkpointing(on);
        let x = Tensor::randn(&[2, 3, 32, 32], DType::F32, CPU, 11)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let targets = Tensor::from_vec(vec![1i64, 4], &[2], CPU).unwrap();
        let mut out = step(&m, &x, &|x| {
            m.forward(x)?
                .cross_entropy(&targets, CrossEntropyOptions::default())
        });
        // The running statistics moved once, as without checkpointing.
        out.extend(
            m.named_buffers()
                .iter()
                .filter(|(n, _)| n.ends_with("running_var"))
                .map(|(_, b)| bits(b)),
        );
        out
    };
    assert_eq!(run(true), run(false));
}

fn spec(model: &str, device: Device, checkpoint: bool) -> StepSpec {
    let input = match model {
        "resnet" => StepInput::Image {
            channels: 3,
            size: 64,
        },
        _ => StepInput::Tokens {
            vocab: BertConfig::tiny().vocab_size,
            hidden: 16,
            seq: 12,
            next_token: false,
        },
    };
    StepSpec {
        batch: 8,
        input,
        classes: 5,
        dtype: DType::F32,
        optimizer: OptimizerKind::Adamw,
        fused: true,
        checkpoint,
        case: leangrad::memory_plan::parse_case("all").unwrap(),
        device,
    }
}

fn build(model: &'static str) -> impl Fn(DType, Device) -> Result<Box<dyn StepModel>> {
    move |dtype, device| -> Result<Box<dyn StepModel>> {
        Ok(match model {
            "resnet" => {
                let config = ResNetConfig {
                    base_width: 8,
                    num_classes: 5,
                    ..ResNetConfig::resnet18(5)
                };
                Box::new(ResNet::new(config, dtype, device, 3)?)
            }
            _ => Box::new(BertClassifier::new(
                BertConfig::tiny(),
                5,
                dtype,
                device,
                3,
            )?),
        })
    }
}

#[test]
fn the_planner_predicts_checkpointed_steps_byte_for_byte_and_lower() {
    use leangrad::autograd::SavePolicy;
    for model in ["resnet", "bert"] {
        for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
            let b = build(model);
            let meta = run_step(&b, &spec(model, Device::Meta, true), policy).unwrap();
            let cpu = run_step(&b, &spec(model, CPU, true), policy).unwrap();
            assert_eq!(
                meta.report.peak_total, cpu.report.peak_total,
                "{model} {policy:?}"
            );
            assert_eq!(
                meta.report.at_peak, cpu.report.at_peak,
                "{model} {policy:?}"
            );
            let plain = run_step(&b, &spec(model, Device::Meta, false), policy).unwrap();
            assert!(
                meta.report.peak_total < plain.report.peak_total,
                "{model} {policy:?}: {} with checkpointing, {} without",
                meta.report.peak_total,
                plain.report.peak_total
            );
        }
    }
}
