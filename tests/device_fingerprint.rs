//! Bit-for-bit fingerprints of what the library computes, kept in
//! `tests/fixtures/fingerprints/`: a change that moves code around (or
//! otherwise claims not to change results) must leave every output,
//! gradient, updated parameter and ledger report bit-identical.
//!
//! Each entry is a SHA-256 over exact values: the loss, the logits, every
//! parameter after the optimizer step, every gradient still held and the
//! input gradient (each as the f64 bit pattern of every element, which is
//! exact for every float dtype), and separately the step's whole ledger
//! report. Covered: one training step of every tiny model (two cases, both
//! save policies, fused SGD-momentum and usual AdamW, f32 and bf16) and the
//! functional layers that the models do not reach (1-d and transposed
//! convolutions with groups and dilation, average and adaptive pooling,
//! group/RMS norms, masked causal attention with dropout, embedding with a
//! padding index).
//!
//! The CPU entries are checked everywhere, on the kernels' path
//! (`LEANGRAD_CPU_PATH`): `cpu.txt` for AVX2 and AVX-512, which give the
//! same bits, `cpu-portable.txt` for the portable path. The CUDA entries are checked on
//! the simulated GPU, whose cuBLAS sums in a fixed order; on a real GPU
//! only the ledger entries are compared (its GEMM summation order is
//! cuBLAS's own). A change that means to alter results regenerates the
//! files with `LEANGRAD_FINGERPRINT_WRITE=1` and says why in its commit.

mod cuda_common;
mod tiny_models;

use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::memory::Ledger;
use leangrad::models::Case;
use leangrad::nn::{
    adaptive_avg_pool2d, avg_pool2d, conv1d, conv_transpose2d, embedding, group_norm, rms_norm,
    scaled_dot_product_attention, AvgPool2dOptions, Conv1dOptions, ConvTranspose2dOptions,
    SdpaOptions,
};
use leangrad::ops::CrossEntropyOptions;
use leangrad::optim::{Adam, Algorithm, Optimizer, Sgd};
use leangrad::{CpuPath, DType, Device, Result, Tensor};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The values of tensors and the ledger, hashed separately.
#[derive(Default)]
struct Print {
    values: Sha256,
    ledger: Sha256,
}

impl Print {
    fn tensor(&mut self, t: &Tensor) {
        self.values
            .update(format!("{:?}{:?}", t.dims(), t.dtype()).as_bytes());
        for v in t.to_f64_vec().expect("read back") {
            self.values.update(v.to_bits().to_le_bytes());
        }
    }

    fn finish(self) -> (String, String) {
        (hex(&self.values.finalize()), hex(&self.ledger.finalize()))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One training step of a tiny model on `device`.
fn model_step(
    build: &tiny_models::Build,
    input: leangrad::memory_plan::StepInput,
    case: Case,
    policy: SavePolicy,
    adamw: bool,
    dtype: DType,
    device: Device,
) -> Result<Print> {
    let mut print = Print::default();
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let mut model = build(dtype, device)?;
    case.apply(model.as_mut())?;
    let params: Vec<Tensor> = model.parameters();
    let trained: Vec<Tensor> = params
        .iter()
        .filter(|p| p.requires_grad())
        .cloned()
        .collect();
    let x = input.make(2, case.input_requires_grad(), dtype, device)?;
    let targets = input.targets(2, 5, device)?;
    let _p = with_save_policy(policy);
    let logits = model.step_logits(&x)?;
    let loss = logits.cross_entropy(&targets, CrossEntropyOptions::default())?;
    fn run<A: Algorithm>(mut opt: Optimizer<A>, loss: &Tensor, fused: bool) -> Result<()> {
        if fused {
            opt.backward_step(loss).map(drop)
        } else {
            loss.backward()?;
            opt.step()
        }
    }
    if adamw {
        run(Optimizer::new(trained, Adam::adamw(1e-3))?, &loss, false)?;
    } else {
        run(
            Optimizer::new(trained, Sgd::new(0.01).momentum(0.9))?,
            &loss,
            true,
        )?;
    }
    print
        .ledger
        .update(format!("{:?}", ledger.report()).as_bytes());
    print.tensor(&loss);
    print.tensor(&logits);
    for p in &params {
        print.tensor(p);
        if let Some(g) = p.grad() {
            print.tensor(&g);
        }
    }
    if let Some(g) = x.grad() {
        print.tensor(&g);
    }
    Ok(print)
}

/// A float input made on the CPU (same values everywhere), on `device`.
fn input(shape: &[usize], seed: u64, dtype: DType, device: Device) -> Result<Tensor> {
    Tensor::randn(shape, dtype, Device::Cpu, seed)?
        .to_device(device)?
        .set_requires_grad(true)
}

/// Runs `f` on fresh inputs, backpropagates the sum of its output times a
/// fixed random tensor, and prints the output, the ledger and every
/// input's gradient.
fn layer(
    device: Device,
    dtype: DType,
    shapes: &[&[usize]],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Print> {
    let mut print = Print::default();
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let xs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| input(s, 100 + i as u64, dtype, device))
        .collect::<Result<_>>()?;
    let y = f(&xs)?;
    let w = Tensor::randn(y.dims(), dtype, Device::Cpu, 7)?.to_device(device)?;
    y.mul(&w)?.sum_all()?.backward()?;
    print
        .ledger
        .update(format!("{:?}", ledger.report()).as_bytes());
    print.tensor(&y);
    for x in &xs {
        if let Some(g) = x.grad() {
            print.tensor(&g);
        }
    }
    Ok(print)
}

/// Every fingerprint on `device`: name → (values, ledger).
fn fingerprints(device: Device) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    let mut put = |name: String, p: Result<Print>| {
        let p = p.unwrap_or_else(|e| panic!("{name} on {device}: {e}"));
        out.insert(name, p.finish());
    };
    for (name, build, step_input) in tiny_models::models() {
        for case in ["all", "input-bn-eval"] {
            for policy in [SavePolicy::Lean, SavePolicy::SaveAll] {
                for adamw in [false, true] {
                    for dtype in [DType::F32, DType::BF16] {
                        let what = format!(
                            "{name}/{case}/{policy:?}/{}/{dtype:?}",
                            if adamw { "adamw" } else { "sgd-fused" }
                        );
                        let case: Case = case.parse().expect("case name");
                        put(
                            what,
                            model_step(&build, step_input, case, policy, adamw, dtype, device),
                        );
                    }
                }
            }
        }
    }
    for dtype in [DType::F32, DType::BF16] {
        let conv1 = |xs: &[Tensor]| {
            let o = Conv1dOptions {
                stride: 2,
                padding: 2,
                dilation: 2,
                groups: 2,
            };
            conv1d(&xs[0], &xs[1], Some(&xs[2]), &o)
        };
        put(
            format!("conv1d/{dtype:?}"),
            layer(device, dtype, &[&[2, 4, 11], &[6, 2, 3], &[6]], &conv1),
        );
        let convt = |xs: &[Tensor]| {
            let o = ConvTranspose2dOptions {
                stride: [2, 1],
                padding: [1, 0],
                output_padding: [1, 0],
                dilation: [1, 2],
                groups: 2,
            };
            conv_transpose2d(&xs[0], &xs[1], Some(&xs[2]), &o)
        };
        put(
            format!("conv_transpose2d/{dtype:?}"),
            layer(device, dtype, &[&[2, 4, 5, 6], &[4, 3, 3, 2], &[6]], &convt),
        );
        let pools = |xs: &[Tensor]| {
            let o = AvgPool2dOptions {
                kernel: [3, 2],
                stride: Some([2, 2]),
                padding: [1, 1],
                count_include_pad: false,
            };
            let a = avg_pool2d(&xs[0], &o)?;
            adaptive_avg_pool2d(&a, [3, 2])
        };
        put(
            format!("avg_pools/{dtype:?}"),
            layer(device, dtype, &[&[2, 3, 9, 7]], &pools),
        );
        let norms = |xs: &[Tensor]| {
            let g = group_norm(&xs[0], 2, Some(&xs[1]), Some(&xs[2]), 1e-5)?;
            rms_norm(&g, &[5], Some(&xs[3]), None)
        };
        put(
            format!("group_rms_norm/{dtype:?}"),
            layer(device, dtype, &[&[3, 4, 6, 5], &[4], &[4], &[5]], &norms),
        );
        let attn = |xs: &[Tensor]| {
            let mask = Tensor::randn(&[5, 5], dtype, Device::Cpu, 9)?.to_device(xs[0].device())?;
            let o = SdpaOptions {
                causal: false,
                mask: Some(mask),
                dropout_p: 0.25,
                seed: 3,
                offset: 0,
                scale: None,
                enable_gqa: false,
            };
            scaled_dot_product_attention(&xs[0], &xs[1], &xs[2], &o)
        };
        put(
            format!("sdpa_mask_dropout/{dtype:?}"),
            layer(
                device,
                dtype,
                &[&[2, 2, 5, 4], &[2, 2, 5, 4], &[2, 2, 5, 6]],
                &attn,
            ),
        );
        let emb = |xs: &[Tensor]| {
            let idx = Tensor::from_vec(vec![1i64, 0, 3, 3, 6, 0], &[2, 3], Device::Cpu)?
                .to_device(xs[0].device())?;
            embedding(&xs[0], &idx, Some(0))
        };
        put(
            format!("embedding/{dtype:?}"),
            layer(device, dtype, &[&[7, 4]], &emb),
        );
    }
    out
}

fn file(device: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fingerprints")
        .join(format!("{device}.txt"))
}

/// Compares `got` with the stored file (or writes it under
/// `LEANGRAD_FINGERPRINT_WRITE=1`); `values` false compares ledgers only.
fn check(device: &str, got: &BTreeMap<String, (String, String)>, values: bool) {
    let path = file(device);
    if std::env::var("LEANGRAD_FINGERPRINT_WRITE").is_ok_and(|v| v == "1") {
        let text: String = got
            .iter()
            .map(|(k, (v, l))| format!("{k} {v} {l}\n"))
            .collect();
        std::fs::create_dir_all(path.parent().expect("folder")).expect("mkdir");
        std::fs::write(&path, text).expect("write fingerprints");
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let want: BTreeMap<String, (String, String)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 3, "{}: malformed line {l}", path.display());
            (f[0].to_string(), (f[1].to_string(), f[2].to_string()))
        })
        .collect();
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "the set of fingerprints changed"
    );
    let mut differ = Vec::new();
    for (k, (v, l)) in got {
        let (wv, wl) = &want[k];
        if wl != l {
            differ.push(format!("{k}: ledger"));
        }
        if values && wv != v {
            differ.push(format!("{k}: values"));
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} fingerprints differ from {}:\n{}",
        differ.len(),
        got.len(),
        path.display(),
        differ.join("\n")
    );
}

/// The CPU fingerprints' file for the kernels' path: the AVX2 and AVX-512
/// kernels sum every element in the same order (their tests check it bit
/// for bit), so they share `cpu`; the portable path's products (the `gemm`
/// crate) and convolutions sum in other orders and have `cpu-portable`.
/// That file holds on any CPU with AVX2 and FMA, where the crate runs its
/// AVX2 kernel: every product here has a depth below 512, one block of the
/// crate's depth blocking whatever the CPU's cache sizes.
fn cpu_file() -> &'static str {
    match leangrad::cpu_path() {
        CpuPath::Portable => "cpu-portable",
        CpuPath::Avx2 | CpuPath::Avx512 => "cpu",
    }
}

#[test]
fn cpu_results_are_bit_identical_to_the_fingerprints() {
    eprintln!("CPU kernels' path: {}", leangrad::cpu_path());
    check(cpu_file(), &fingerprints(Device::Cpu), true);
}

#[test]
fn cuda_results_are_bit_identical_to_the_fingerprints() {
    let Some(dev) = cuda_common::device("cuda_results_are_bit_identical_to_the_fingerprints")
    else {
        return;
    };
    let simulated = dev.is_simulated();
    check("cuda-gpusim", &fingerprints(Device::Cuda(0)), simulated);
}
