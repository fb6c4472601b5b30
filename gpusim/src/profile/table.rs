//! The readable summary of a profile, like `nsys stats`' kernel summary:
//! the counts, then kernels and GEMMs sorted by predicted device time.

use super::model::{self, Bound, Gpu};
use super::Profile;
use std::collections::HashMap;
use std::fmt::Write;

/// One row of the kernel table: a kernel name over all its launches.
#[derive(Clone, Debug, Default)]
pub struct KernelRow {
    /// The kernel.
    pub name: String,
    /// Launches.
    pub launches: u64,
    /// Predicted device time over all of them, µs.
    pub total_us: f64,
    /// What bounds the launches that take most of that time.
    pub bound: Option<Bound>,
    /// Thread-instructions.
    pub thread_instructions: u64,
    /// Threads launched (blocks × threads per block, over all launches).
    pub threads: u64,
    /// Global requests and sectors.
    pub global_requests: u64,
    /// Sectors of those requests.
    pub global_sectors: u64,
    /// Distinct sectors (summed over launches), × 32 = DRAM bytes at least.
    pub unique_sectors: u64,
}

/// Kernels by predicted device time, largest first.
pub fn kernel_rows(p: &Profile, gpu: &Gpu) -> Vec<KernelRow> {
    let per_record = p.record_uses().0;
    let mut rows: HashMap<u32, (KernelRow, HashMap<Bound, f64>)> = HashMap::new();
    for (l, &n) in p.launches.iter().zip(&per_record) {
        if n == 0 {
            continue;
        }
        let (us, bound) = model::launch_us(l, gpu, &model::COSTS);
        let (row, bounds) = rows.entry(l.kernel).or_default();
        row.name = p.kernels[l.kernel as usize].clone();
        row.launches += n;
        row.total_us += us * n as f64;
        *bounds.entry(bound).or_default() += us * n as f64;
        let c = &l.counters;
        row.thread_instructions += c.total_thread_instructions() * n;
        row.threads += l.blocks() * l.threads_per_block() * n;
        row.global_requests += (c.global_load_requests + c.global_store_requests) * n;
        row.global_sectors += c.global_sectors * n;
        row.unique_sectors += c.unique_sectors * n;
    }
    let mut out: Vec<KernelRow> = rows
        .into_values()
        .map(|(mut row, bounds)| {
            row.bound = bounds
                .into_iter()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|b| b.0);
            row
        })
        .collect();
    out.sort_by(|a, b| b.total_us.total_cmp(&a.total_us).then(a.name.cmp(&b.name)));
    out
}

/// The summary: counts, the prediction, and the top kernels and GEMMs.
pub fn summary(p: &Profile, gpu: &Gpu) -> String {
    let c = p.counts();
    let pred = model::predict(p, gpu);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "gpusim profile: {} launches, {} cuBLAS calls, {} syncs, {} H2D ({} bytes), {} D2H ({} bytes), {} D2D, {} memsets, {} allocs, {} frees",
        c.launches, c.cublas_calls, c.syncs, c.h2d, c.h2d_bytes, c.d2h, c.d2h_bytes, c.d2d,
        c.memsets, c.allocs, c.frees
    );
    if c.collectives > 0 {
        let _ = writeln!(
            s,
            "{} NCCL operations ({} bytes), {:.3} ms predicted",
            c.collectives,
            c.collective_bytes,
            pred.collectives_us / 1e3
        );
    }
    let _ = writeln!(
        s,
        "predicted on {}: {:.3} ms (device: kernels {:.3} ms, GEMMs {:.3} ms, copies {:.3} ms; idle waiting for the host {:.3} ms)",
        gpu.name,
        pred.total_us / 1e3,
        pred.kernels_us / 1e3,
        pred.gemms_us / 1e3,
        pred.copies_us / 1e3,
        pred.device_idle_us / 1e3
    );
    let device = (pred.kernels_us + pred.gemms_us + pred.copies_us + pred.collectives_us).max(1e-9);
    let _ = writeln!(
        s,
        "\n Time(%)  Total(µs)  Instances  Avg(µs)  Bound    Inst/thread  Sectors/req  Name"
    );
    for r in kernel_rows(p, gpu).iter().take(25) {
        let _ = writeln!(
            s,
            "{:>8.1} {:>10.1} {:>10} {:>8.1}  {:<8} {:>11.1} {:>12.2}  {}",
            100.0 * r.total_us / device,
            r.total_us,
            r.launches,
            r.total_us / r.launches as f64,
            r.bound.map_or("-", Bound::name),
            r.thread_instructions as f64 / r.threads.max(1) as f64,
            r.global_sectors as f64 / r.global_requests.max(1) as f64,
            r.name
        );
    }
    gemm_table(&mut s, p, gpu, &pred, device);
    s
}

fn gemm_table(s: &mut String, p: &Profile, gpu: &Gpu, pred: &model::Prediction, device: f64) {
    let calls = p.record_uses().1;
    let mut order: Vec<usize> = (0..p.gemms.len()).filter(|&i| calls[i] > 0).collect();
    order.sort_by(|&a, &b| pred.per_gemm_us[b].total_cmp(&pred.per_gemm_us[a]));
    if order.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n Time(%)  Total(µs)      Calls  Avg(µs)  Bound        m      n      k  batch  types (compute)  entry"
    );
    for &i in order.iter().take(15) {
        let g = &p.gemms[i];
        let (_, bound) = model::gemm_us(g, gpu, &model::COSTS);
        let _ = writeln!(
            s,
            "{:>8.1} {:>10.1} {:>10} {:>8.1}  {:<8} {:>6} {:>6} {:>6} {:>6}  {:?}→{:?} ({:?})  {}",
            100.0 * pred.per_gemm_us[i] / device,
            pred.per_gemm_us[i],
            calls[i],
            pred.per_gemm_us[i] / calls[i] as f64,
            bound.name(),
            g.m,
            g.n,
            g.k,
            g.batch,
            g.ab_type,
            g.c_type,
            g.compute,
            g.entry
        );
    }
}
