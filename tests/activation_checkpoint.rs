//! Activation checkpointing (`autograd::checkpoint`): gradients bit for bit
//! those of the same graph without it, under both policies, with dropout,
//! nested segments, shared parameters and the fused optimizer; what the
//! forward keeps; the segment run once more in backward and not at all
//! when nothing in it needs a gradient; clear errors for misuse. And
//! `gradient_checkpointing(true)` on every model that has it: the loss and
//! every gradient bit for bit those without it; the memory planner's step
//! with `checkpoint` predicted on the meta device byte for byte as the CPU
//! runs it, and below the step without checkpointing.
use leangrad::autograd::{checkpoint, no_grad, with_save_policy, SavePolicy};
use leangrad::memory::{Category, Ledger};
use leangrad::memory_plan::{run_step, OptimizerKind, StepInput, StepModel, StepSpec};
use leangrad::models::{Bert, BertClassifier, BertConfig, Gpt2, Gpt2Config, ResNet, ResNetConfig};
use leangrad::models::{InvertedResidualSetting, MobileNetV2, MobileNetV2Config, ViT, ViTConfig};
use leangrad::nn::{BatchNorm, Dropout, Linear, Module};
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Adam, Optimizer};
use leangrad::{DType, Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const CPU: Device = Device::Cpu;

/// Two blocks of `fc(relu(fc(x)))` with dropout, seeded alike on every call.
struct Net {
    blocks: Vec<Arc<Block>>,
}

struct Block {
    fc1: Linear,
    fc2: Linear,
    drop: Dropout,
}

impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.fc1.forward(x)?.relu()?;
        let h = self.drop.forward(&h)?;
        self.fc2.forward(&h)?.gelu(false)
    }
}

fn net(device: Device) -> Net {
    let blocks = (0..2u64)
        .map(|i| {
            let lin = |a, b, s| {
                Linear::builder(a, b)
                    .name("fc")
                    .seed(s)
                    .build(&device)
                    .unwrap()
            };
            Arc::new(Block {
                fc1: lin(8, 32, 10 + i),
                fc2: lin(32, 8, 20 + i),
                drop: Dropout::new("drop", 0.25, 7 + i).unwrap(),
            })
        })
        .collect();
    Net { blocks }
}

impl Net {
    fn params(&self) -> Vec<Tensor> {
        self.blocks
            .iter()
            .flat_map(|b| [b.fc1.parameters(), b.fc2.parameters()].concat())
            .collect()
    }

    /// The loss, each block checkpointed when `segments`.
    fn loss(&self, x: &Tensor, segments: bool) -> Result<Tensor> {
        let mut h = x.clone();
        for b in &self.blocks {
            h = if segments {
                let b = b.clone();
                checkpoint(move |xs| b.forward(&xs[0]), &[&h])?
            } else {
                b.forward(&h)?
            };
        }
        h.square()?.mean_all()
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Input and parameter gradients of one backward.
fn grads(segments: bool, policy: SavePolicy, input_grad: bool) -> Vec<Vec<u32>> {
    let _p = with_save_policy(policy);
    let n = net(CPU);
    let x = Tensor::randn(&[4, 8], DType::F32, CPU, 3)
        .unwrap()
        .set_requires_grad(input_grad)
        .unwrap();
    let loss = n.loss(&x, segments).unwrap();
    loss.backward().unwrap();
    let mut out = vec![bits(&loss)];
    if input_grad {
        out.push(bits(&x.grad().unwrap()));
    }
    out.extend(n.params().iter().map(|p| bits(&p.grad().unwrap())));
    out
}

#[test]
fn gradients_are_bit_for_bit_those_without_checkpointing() {
    for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
        for input_grad in [true, false] {
            assert_eq!(
                grads(true, policy, input_grad),
                grads(false, policy, input_grad),
                "{policy:?}, input requires grad: {input_grad}"
            );
        }
    }
}

/// The bytes saved for backward when the forward is done, and the step's peak.
fn saved_and_peak(segments: bool) -> (u64, u64) {
    let ledger = Ledger::new();
    let _g = ledger.enter();
    let n = net(CPU);
    let x = Tensor::randn(&[64, 8], DType::F32, CPU, 3).unwrap();
    let loss = n.loss(&x, segments).unwrap();
    let saved = ledger.live_in(CPU, Category::Saved) as u64;
    loss.backward().unwrap();
    (saved, ledger.peak(CPU) as u64)
}

#[test]
fn the_forward_keeps_only_the_segments_inputs() {
    let (saved, _) = saved_and_peak(true);
    let (saved_plain, _) = saved_and_peak(false);
    // Each block's input (64×8 f32) and what the loss saves (the second
    // block's output, for the square's gradient).
    assert_eq!(saved, 3 * 64 * 8 * 4, "plain: {saved_plain}");
    assert!(saved_plain > 4 * saved, "{saved_plain} vs {saved}");
}

#[test]
fn the_segment_runs_once_more_in_backward_and_never_without_gradients() {
    let calls = Arc::new(AtomicUsize::new(0));
    let n = net(CPU);
    let run = |x: &Tensor| {
        let (b, c) = (n.blocks[0].clone(), calls.clone());
        checkpoint(
            move |xs| {
                c.fetch_add(1, Ordering::SeqCst);
                b.forward(&xs[0])
            },
            &[x],
        )
        .unwrap()
    };
    let x = Tensor::randn(&[4, 8], DType::F32, CPU, 3).unwrap();
    let y = run(&x);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // Under no_grad, and when nothing needs a gradient: one run, no node.
    {
        let _ng = no_grad();
        assert!(!run(&x).requires_grad());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let frozen = |l: &Linear| {
        let mut f = Linear::builder(1, 1).build(&CPU).unwrap();
        f.weight = l.weight.detach();
        f.bias = l.bias.as_ref().map(Tensor::detach);
        f
    };
    let b = Arc::new(Block {
        fc1: frozen(&n.blocks[0].fc1),
        fc2: frozen(&n.blocks[0].fc2),
        drop: Dropout::new("drop", 0.25, 1).unwrap(),
    });
    let c = calls.clone();
    let y = checkpoint(
        move |xs| {
            c.fetch_add(1, Ordering::SeqCst);
            b.forward(&xs[0])
        },
        &[&x],
    )
    .unwrap();
    assert!(!y.requires_grad());
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[test]
fn nested_segments_give_the_same_gradients() {
    let n = net(CPU);
    let x = Tensor::randn(&[4, 8], DType::F32, CPU, 3)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let (b0, b1) = (n.blocks[0].clone(), n.blocks[1].clone());
    // An outer segment of both blocks, the second block a segment inside it.
    let y = checkpoint(
        move |xs| {
            let h = b0.forward(&xs[0])?;
            let b1 = b1.clone();
            checkpoint(move |hs| b1.forward(&hs[0]), &[&h])
        },
        &[&x],
    )
    .unwrap();
    let loss = y.square().unwrap().mean_all().unwrap();
    loss.backward().unwrap();
    let mut got = vec![bits(&loss), bits(&x.grad().unwrap())];
    got.extend(n.params().iter().map(|p| bits(&p.grad().unwrap())));
    assert_eq!(got, grads(false, SavePolicy::Lean, true));
}

/// Parameters after two fused AdamW steps of a net whose two segments use
/// the same block (its parameters have edges from both).
fn fused_steps_with_shared_block(segments: bool) -> Vec<Vec<u32>> {
    let n = net(CPU);
    let shared = n.blocks[0].clone();
    let params = [shared.fc1.parameters(), shared.fc2.parameters()].concat();
    let mut opt = Optimizer::new(params.clone(), Adam::adamw(1e-2)).unwrap();
    for step in 0..2 {
        let x = Tensor::randn(&[4, 8], DType::F32, CPU, 30 + step).unwrap();
        let mut h = x;
        for _ in 0..2 {
            let b = shared.clone();
            h = if segments {
                checkpoint(move |xs| b.forward(&xs[0]), &[&h]).unwrap()
            } else {
                b.forward(&h).unwrap()
            };
        }
        let loss = h.square().unwrap().mean_all().unwrap();
        opt.backward_step(&loss).unwrap();
    }
    params.iter().map(bits).collect()
}

#[test]
fn a_parameter_two_segments_use_is_final_after_both_under_the_fused_optimizer() {
    assert_eq!(
        fused_steps_with_shared_block(true),
        fused_steps_with_shared_block(false)
    );
}

#[test]
fn batch_norm_running_statistics_move_once_per_forward() {
    let stats = |segments: bool| {
        let bn = Arc::new(BatchNorm::builder(8).build1d(&CPU).unwrap());
        let x = Tensor::randn(&[16, 8], DType::F32, CPU, 5)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let b = bn.clone();
        let y = if segments {
            checkpoint(move |xs| b.forward(&xs[0]), &[&x]).unwrap()
        } else {
            bn.forward(&x).unwrap()
        };
        y.square().unwrap().sum_all().unwrap().backward().unwrap();
        let buffers: Vec<Vec<u32>> = [&bn.running_mean, &bn.running_var]
            .iter()
            .map(|t| bits(t.as_ref().unwrap()))
            .collect();
        let tracked = bn
            .num_batches_tracked
            .as_ref()
            .unwrap()
            .to_f64_vec()
            .unwrap();
        (buffers, tracked, bits(&x.grad().unwrap()))
    };
    let (with, plain) = (stats(true), stats(false));
    assert_eq!(with, plain);
    assert_eq!(with.1, vec![1.0]);
}

#[test]
fn misuse_is_a_clear_error() {
    let x = Tensor::randn(&[4, 8], DType::F32, CPU, 3)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    // A segment that writes over its input.
    let plain = Tensor::randn(&[4, 8], DType::F32, CPU, 4).unwrap();
    let err = checkpoint(
        |xs| {
            xs[0].add_scalar_(1.0)?;
            xs[0].mul(&xs[0])
        },
        &[&plain],
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { op: "checkpoint", msg } if msg.contains("in place")),
        "{err}"
    );
    // A segment that reads a non-leaf tensor requiring grad it was not given.
    let outside = x.relu().unwrap();
    let err = checkpoint(move |xs| xs[0].mul(&outside), &[&plain]).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { op: "checkpoint", msg } if msg.contains("inputs")),
        "{err}"
    );
    // An error inside the segment comes out as it is, and leaves no state
    // behind: the next segment works.
    let err = checkpoint(|xs| xs[0].matmul(&xs[0]), &[&x]).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    let y = checkpoint(|xs| xs[0].tanh(), &[&x]).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let want: Vec<f32> = x
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| 1.0 - v.tanh() * v.tanh())
        .collect();
    let got = x.grad().unwrap().to_vec::<f32>().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{g} vs {w}");
    }
    // A segment that returns its input: the gradient goes straight to it.
    let z = Tensor::randn(&[3], DType::F32, CPU, 9)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let same = checkpoint(|xs| Ok(xs[0].clone()), &[&z]).unwrap();
    same.sum_all().unwrap().backward().unwrap();
    assert_eq!(z.grad().unwrap().to_vec::<f32>().unwrap(), vec![1.0; 3]);
}

#[test]
fn the_meta_device_predicts_the_cpu_ledger_byte_for_byte() {
    let run = |device: Device| {
        let ledger = Ledger::new().record_timeline(true);
        let _g = ledger.enter();
        let n = net(device);
        let x = Tensor::randn(&[64, 8], DType::F32, device, 3).unwrap();
        let loss = n.loss(&x, true).unwrap();
        let forward_peak = ledger.peak(device);
        loss.backward().unwrap();
        let events: Vec<_> = ledger
            .timeline()
            .iter()
            .map(|e| (e.bytes, e.category, e.kind))
            .collect();
        (
            forward_peak,
            ledger.peak(device),
            ledger.at_peak(device),
            events,
        )
    };
    assert_eq!(run(Device::Meta), run(CPU));
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
        optimizer_state: leangrad::optim::StateFormat::Full,
        autocast: None,
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

#[test]
fn mobilenet_v2_blocks_checkpointed_with_dropout_give_the_same_gradients() {
    let run = |on: bool| {
        let config = MobileNetV2Config {
            stem: 4,
            settings: [(1, 4, 1, 1), (6, 6, 2, 2)]
                .iter()
                .map(|&(t, c, n, s)| InvertedResidualSetting { t, c, n, s })
                .collect(),
            last_channel: 16,
            num_classes: 5,
            in_channels: 3,
            dropout: 0.2,
        };
        let mut m = MobileNetV2::new(&config, DType::F32, CPU, 3).unwrap();
        m.gradient_checkpointing(on);
        let x = Tensor::randn(&[2, 3, 32, 32], DType::F32, CPU, 11)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let targets = Tensor::from_vec(vec![1i64, 4], &[2], CPU).unwrap();
        step(&m, &x, &|x| {
            m.forward(x)?
                .cross_entropy(&targets, CrossEntropyOptions::default())
        })
    };
    assert_eq!(run(true), run(false));
}
