//! Matrix products of views on every device: the values equal the CPU's
//! and the product allocates exactly what it allocates on the CPU — the
//! output only, for every view the CPU's gemm reads in place (rows spaced
//! wider than they are long, as attention heads are; an offset window;
//! broadcast, permuted and backwards-running batch dims; transposes). The
//! CUDA backend once copied each such operand to a counted contiguous
//! buffer first (gpt2_tiny's attention: 24 allocations more than the CPU).
mod cuda_common;
mod device_common;

use device_common::{assert_close, fresh_copy, input, FLOATS};
use leangrad::memory::Ledger;
use leangrad::{DType, Device, Result, Tensor};

type Views = fn(&Tensor, &Tensor) -> Result<(Tensor, Tensor)>;

/// `f`'s two views of copies of `a`, `b` on `dev` multiplied in a fresh
/// ledger: the product (on the host), and the allocations and peak bytes
/// the product made on `dev`.
fn product(dev: Device, a: &Tensor, b: &Tensor, f: Views) -> (Tensor, u64, usize) {
    let ledger = Ledger::new();
    let _guard = ledger.enter();
    let (a, b) = (fresh_copy(a, dev), fresh_copy(b, dev));
    let (va, vb) = f(&a, &b).unwrap();
    let (count, live) = (ledger.allocation_count(dev), ledger.live(dev));
    ledger.reset_peak();
    let y = va
        .matmul(&vb)
        .unwrap_or_else(|e| panic!("matmul on {dev}: {e}"));
    let allocations = ledger.allocation_count(dev) - count;
    let peak = ledger.peak(dev) - live;
    (y.to_device(Device::Cpu).unwrap(), allocations, peak)
}

/// Attention heads: `[n, seq, heads·dim]` split into `[n, heads, seq, dim]`
/// views (row stride `heads·dim`, batch strides `seq·heads·dim` and `dim`).
fn heads(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let split = |t: &Tensor| t.reshape(&[2, 5, 3, 4])?.permute(&[0, 2, 1, 3]);
    Ok((split(a)?, split(b)?.transpose(-2, -1)?))
}

/// `probs · v` of attention: a contiguous `[n, heads, seq, seq]` by a head view.
fn probs_by_heads(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let v = b.reshape(&[2, 5, 3, 4])?.permute(&[0, 2, 1, 3])?;
    Ok((a.reshape(&[2, 3, 5, 4])?.matmul(&v.transpose(-2, -1)?)?, v))
}

/// A window of columns (offset 3, rows 20 apart) by a transposed window.
fn windows(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let a = a.reshape(&[6, 20])?.narrow(1, 3, 9)?;
    let b = b
        .reshape(&[12, 10])?
        .narrow(0, 2, 4)?
        .narrow(1, 1, 9)?
        .t()?;
    Ok((a, b))
}

/// Batch dims swapped (offsets run backwards between rows of batches) by
/// one matrix broadcast over the batch.
fn permuted_batch(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let a = a.reshape(&[3, 4, 2, 5])?.permute(&[1, 0, 2, 3])?;
    let b = b.reshape(&[24, 5])?.narrow(0, 4, 5)?.narrow(1, 0, 3)?;
    Ok((a, b))
}

/// A batch broadcast on the left (`[1, 6, 4]` against `[5, 4, 6]`), the
/// right operand transposed per batch.
fn broadcast_left(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let a = a.reshape(&[5, 6, 4])?.narrow(0, 1, 1)?;
    let b = b.reshape(&[5, 6, 4])?.transpose(-2, -1)?;
    Ok((a, b))
}

#[test]
fn products_of_views_match_the_cpu_and_allocate_only_their_output() {
    let cases: [(&str, Views); 5] = [
        ("attention heads q·kᵀ", heads),
        ("attention probs·v", probs_by_heads),
        ("offset windows", windows),
        ("permuted batch, shared rhs", permuted_batch),
        ("broadcast batch", broadcast_left),
    ];
    for dtype in FLOATS.into_iter().chain([DType::F64]) {
        let a = input(&[120], dtype, 1, -1.0, 1.0);
        let b = input(&[120], dtype, 2, -1.0, 1.0);
        for (name, f) in cases {
            let (want, count, peak) = product(Device::Cpu, &a, &b, f);
            assert_eq!(count, 1, "{name} {dtype:?} on the CPU: only the output");
            for dev in cuda_common::devices(name) {
                let (got, c, p) = product(dev, &a, &b, f);
                let what = format!("{name} {dtype:?} on {dev}");
                assert_close(&what, &want, &got);
                assert_eq!(c, count, "{what}: allocations vs the CPU's");
                assert_eq!(p, peak, "{what}: peak bytes vs the CPU's");
            }
        }
    }
}
