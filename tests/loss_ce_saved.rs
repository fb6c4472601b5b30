//! What cross-entropy keeps: its softmax probabilities, or nothing of its
//! own while another op keeps the logits anyway (the probabilities are then
//! recomputed by the forward's kernel in backward, so the gradient is the
//! same to the bit); when that op lets the logits go, the probabilities are
//! made again so the logits are not kept alive by the loss alone.

use leangrad::autograd::{with_save_policy, SavePolicy};
use leangrad::memory::{Category, Ledger};
use leangrad::ops::CrossEntropyOptions;
use leangrad::{DType, Device, Result, Tensor};

const N: usize = 6;
const C: usize = 1000;
const LOGIT_BYTES: usize = N * C * 4;

fn inputs() -> Result<(Tensor, Tensor)> {
    let a = Tensor::randn(&[N, C], DType::F32, Device::Cpu, 1)?.set_requires_grad(true)?;
    let t = Tensor::from_vec(vec![3i64, 999, 0, 17, 17, 500], &[N], Device::Cpu)?;
    Ok((a, t))
}

fn bits(t: &Tensor) -> Result<Vec<u64>> {
    Ok(t.to_f64_vec()?.iter().map(|v| v.to_bits()).collect())
}

/// The logits' gradient of cross-entropy alone, and the saved bytes after
/// its forward.
fn alone() -> Result<(Vec<u64>, usize)> {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let (a, t) = inputs()?;
    let z = a.mul_scalar(2.0)?;
    let loss = z.cross_entropy(&t, CrossEntropyOptions::default())?;
    let saved = ledger.live_in(Device::Cpu, Category::Saved);
    loss.backward()?;
    Ok((bits(&a.grad().expect("grad"))?, saved))
}

#[test]
fn alone_it_keeps_the_probabilities() -> Result<()> {
    let (_, saved) = alone()?;
    // the probabilities; the targets are the caller's (I64, 8 bytes each)
    assert_eq!(saved, LOGIT_BYTES + 8 * N);
    Ok(())
}

#[test]
fn beside_an_op_that_keeps_the_logits_it_keeps_nothing_of_its_own() -> Result<()> {
    let (reference, _) = alone()?;
    for saved_first in [true, false] {
        let ledger = Ledger::new();
        let _l = ledger.enter();
        let (a, t) = inputs()?;
        let z = a.mul_scalar(2.0)?;
        // square saves its input, the logits: before or after the loss.
        let (loss, square) = if saved_first {
            let sq = z.square()?;
            (z.cross_entropy(&t, CrossEntropyOptions::default())?, sq)
        } else {
            let loss = z.cross_entropy(&t, CrossEntropyOptions::default())?;
            (loss, z.square()?)
        };
        let saved = ledger.live_in(Device::Cpu, Category::Saved);
        assert_eq!(saved, LOGIT_BYTES + 8 * N, "saved first: {saved_first}");
        loss.backward()?;
        assert_eq!(bits(&a.grad().expect("grad"))?, reference);
        drop(square);
    }
    Ok(())
}

#[test]
fn when_the_other_op_lets_go_the_probabilities_come_back() -> Result<()> {
    let (reference, _) = alone()?;
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let (a, t) = inputs()?;
    let z = a.mul_scalar(2.0)?;
    let square = z.square()?;
    let loss = z.cross_entropy(&t, CrossEntropyOptions::default())?;
    drop(z);
    // Only square's node and the loss hold the logits now; when square's
    // node goes, the loss makes its probabilities and lets the logits go.
    let before = ledger.live(Device::Cpu);
    drop(square);
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::Saved),
        LOGIT_BYTES + 8 * N
    );
    // the logits were freed and the probabilities made: same live bytes,
    // minus square's output
    assert_eq!(ledger.live(Device::Cpu), before - LOGIT_BYTES);
    loss.backward()?;
    assert_eq!(bits(&a.grad().expect("grad"))?, reference);
    Ok(())
}

#[test]
fn the_pytorch_policy_keeps_the_probabilities_regardless() -> Result<()> {
    let ledger = Ledger::new();
    let _l = ledger.enter();
    let _p = with_save_policy(SavePolicy::SaveAll);
    let (a, t) = inputs()?;
    let z = a.mul_scalar(2.0)?;
    let _square = z.square()?;
    let loss = z.cross_entropy(&t, CrossEntropyOptions::default())?;
    // square's input, and the loss's probabilities and targets
    assert_eq!(
        ledger.live_in(Device::Cpu, Category::Saved),
        2 * LOGIT_BYTES + 8 * N
    );
    drop(loss);
    Ok(())
}
