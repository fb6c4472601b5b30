//! leangrad's saved bytes next to PyTorch's for the same training step.
//!
//! `tests/fixtures/pytorch_saved_bytes.json` was written by
//! `python-compare/pytorch_saved_bytes.py`: for full-size ResNet-18/50 at
//! batch 16, 224², every selective-differentiation case, the bytes of every
//! distinct non-parameter storage PyTorch's autograd saves during forward
//! and cross-entropy. Here the same steps run on leangrad's meta device.

use leangrad::memory_plan::{plan, OptimizerKind, StepInput, StepSpec};
use leangrad::models::Case;
use leangrad::{DType, Device};
use std::path::PathBuf;

struct Row {
    model: String,
    case: Case,
    batch: usize,
    size: usize,
    pytorch: usize,
}

fn rows() -> Vec<Row> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("run under cargo");
    let path = PathBuf::from(dir).join("tests/fixtures/pytorch_saved_bytes.json");
    let text = std::fs::read_to_string(&path).expect("fixture");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    json.as_array()
        .expect("an array")
        .iter()
        .map(|r| Row {
            model: r["model"].as_str().unwrap().to_string(),
            case: r["case"].as_str().unwrap().parse().unwrap(),
            batch: r["batch"].as_u64().unwrap() as usize,
            size: r["size"].as_u64().unwrap() as usize,
            pytorch: r["pytorch_saved_bytes"].as_u64().unwrap() as usize,
        })
        .collect()
}

#[test]
fn save_all_keeps_what_pytorch_keeps_and_lean_never_more() {
    let rows = rows();
    assert_eq!(rows.len(), 28);
    for r in rows {
        let spec = StepSpec {
            batch: r.batch,
            input: StepInput::Image {
                channels: 3,
                size: r.size,
            },
            classes: 1000,
            dtype: DType::F32,
            optimizer: OptimizerKind::Sgd,
            fused: false,
            case: r.case,
            device: Device::Meta,
        };
        let p = plan(&r.model, &spec).unwrap();
        let lean = p.lean.report.peak.saved;
        let all = p.pytorch.report.peak.saved;
        let what = format!("{} batch {} {}", r.model, r.batch, r.case);
        // The measured differences, all explained: PyTorch also saves
        // nll_loss's 4-byte total weight; its addmm skips the classifier's
        // input when the classifier's weight is frozen (save-all keeps it:
        // batch·2048·4 bytes for ResNet-50); in eval mode its BatchNorm
        // keeps a per-channel vector (save-all reads running statistics,
        // model state). Worst: 212,484 of 1.37 GB.
        // Bound: 4 + batch·2048·4 + 4·(BatchNorm channels, 53,120 in
        // ResNet-50) bytes = 374,788 at batch 16.
        let bound = 4 + r.batch * 2048 * 4 + 4 * 53_120;
        let gap = all.abs_diff(r.pytorch);
        assert!(
            gap <= bound,
            "{what}: save-all {all} vs PyTorch {}",
            r.pytorch
        );
        assert!(lean <= all, "{what}: lean {lean} > save-all {all}");
        assert!(
            lean <= r.pytorch,
            "{what}: lean {lean} > PyTorch {}",
            r.pytorch
        );
        if r.case.to_string() == "input-bn-eval" {
            // Frozen network, BatchNorm in eval: ReLU's 1-bit masks and
            // max-pool's u8 indices only.
            assert!(
                lean * 40 < r.pytorch,
                "{what}: lean {lean} vs {}",
                r.pytorch
            );
        }
    }
}
