//! Profiles of a larger input predicted from two smaller runs: a step's
//! launches, GEMMs and copies are the same at every image size, and each
//! count (grid size, instructions, sectors, GEMM dimension, bytes) is an
//! affine function of the number of pixels, so two runs give it at any
//! size. The simulator then need not run a 224×224 step to predict one.

use super::{intern, Event, GemmRecord, LaunchCounters, LaunchRecord, Profile};

/// `a + (b − a)·t`, rounded, at least `floor`.
fn lerp(a: u64, b: u64, t: f64, floor: u64) -> u64 {
    let v = a as f64 + (b as f64 - a as f64) * t;
    (v.round().max(floor as f64)) as u64
}

fn lerp_arr<const N: usize>(a: &[u64; N], b: &[u64; N], t: f64) -> [u64; N] {
    std::array::from_fn(|i| lerp(a[i], b[i], t, 0))
}

fn counters(a: &LaunchCounters, b: &LaunchCounters, t: f64) -> LaunchCounters {
    LaunchCounters {
        thread_instructions: lerp_arr(&a.thread_instructions, &b.thread_instructions, t),
        warp_instructions: lerp_arr(&a.warp_instructions, &b.warp_instructions, t),
        flops: lerp_arr(&a.flops, &b.flops, t),
        global_load_requests: lerp(a.global_load_requests, b.global_load_requests, t, 0),
        global_store_requests: lerp(a.global_store_requests, b.global_store_requests, t, 0),
        global_sectors: lerp(a.global_sectors, b.global_sectors, t, 0),
        unique_sectors: lerp(a.unique_sectors, b.unique_sectors, t, 0),
        shared_requests: lerp(a.shared_requests, b.shared_requests, t, 0),
        shared_wavefronts: lerp(a.shared_wavefronts, b.shared_wavefronts, t, 0),
    }
}

fn launch(a: &LaunchRecord, b: &LaunchRecord, t: f64) -> LaunchRecord {
    LaunchRecord {
        kernel: a.kernel,
        grid: std::array::from_fn(|i| lerp(a.grid[i] as u64, b.grid[i] as u64, t, 1) as u32),
        block: a.block,
        shared_bytes: a.shared_bytes,
        counters: counters(&a.counters, &b.counters, t),
    }
}

fn gemm(a: &GemmRecord, b: &GemmRecord, t: f64) -> GemmRecord {
    let d = |x: u64, y: u64| lerp(x, y, t, 1);
    GemmRecord {
        m: d(a.m, b.m),
        n: d(a.n, b.n),
        k: d(a.k, b.k),
        batch: d(a.batch, b.batch),
        ld: std::array::from_fn(|i| d(a.ld[i], b.ld[i])),
        ..a.clone()
    }
}

/// The profile at `t` on the line through `a` (at t = 0) and `b` (t = 1):
/// for runs at `p_a` and `p_b` pixels, `t = (p − p_a) / (p_b − p_a)` gives
/// the run at `p` pixels. The two must have made the same calls in the
/// same order (kernel names, block shapes, GEMM entry points, transposes
/// and types, event kinds); otherwise an error says where they differ.
pub fn extrapolate(a: &Profile, b: &Profile, t: f64) -> Result<Profile, String> {
    if a.events.len() != b.events.len() {
        return Err(format!(
            "the runs made {} and {} calls",
            a.events.len(),
            b.events.len()
        ));
    }
    let mut out = Profile {
        kernels: a.kernels.clone(),
        ..Profile::new()
    };
    for (i, (ea, eb)) in a.events.iter().zip(&b.events).enumerate() {
        let differ = || format!("call {i} differs: {ea:?} and {eb:?}");
        let e = match (*ea, *eb) {
            (Event::Launch(x), Event::Launch(y)) => {
                let (la, lb) = (&a.launches[x as usize], &b.launches[y as usize]);
                if a.kernels[la.kernel as usize] != b.kernels[lb.kernel as usize]
                    || la.block != lb.block
                {
                    return Err(differ());
                }
                out.launches.push(launch(la, lb, t));
                Event::Launch(out.launches.len() as u32 - 1)
            }
            (Event::Gemm(x), Event::Gemm(y)) => {
                let (ga, gb) = (&a.gemms[x as usize], &b.gemms[y as usize]);
                let same = (
                    &ga.entry, ga.transa, ga.transb, ga.ab_type, ga.c_type, ga.compute,
                ) == (
                    &gb.entry, gb.transa, gb.transb, gb.ab_type, gb.c_type, gb.compute,
                );
                if !same {
                    return Err(differ());
                }
                out.gemms.push(gemm(ga, gb, t));
                Event::Gemm(out.gemms.len() as u32 - 1)
            }
            (Event::Sync(x), Event::Sync(y)) if x == y => Event::Sync(x),
            (Event::HtoD(x), Event::HtoD(y)) => Event::HtoD(lerp(x, y, t, 0)),
            (Event::DtoH(x), Event::DtoH(y)) => Event::DtoH(lerp(x, y, t, 0)),
            (Event::DtoD(x), Event::DtoD(y)) => Event::DtoD(lerp(x, y, t, 0)),
            (Event::Memset(x), Event::Memset(y)) => Event::Memset(lerp(x, y, t, 0)),
            (Event::Alloc(x), Event::Alloc(y)) => Event::Alloc(lerp(x, y, t, 0)),
            (Event::Free(x), Event::Free(y)) => Event::Free(lerp(x, y, t, 0)),
            (Event::Collective(k, x), Event::Collective(l, y)) if k == l => {
                Event::Collective(k, lerp(x, y, t, 0))
            }
            _ => return Err(differ()),
        };
        out.events.push(e);
    }
    Ok(out.deduplicated())
}

impl Profile {
    /// The same profile with equal launch and GEMM records stored once.
    pub fn deduplicated(&self) -> Profile {
        let mut out = Profile {
            kernels: self.kernels.clone(),
            ..Profile::new()
        };
        let mut launches = std::collections::HashMap::new();
        let mut gemms = std::collections::HashMap::new();
        for e in &self.events {
            out.events.push(match *e {
                Event::Launch(i) => Event::Launch(intern(
                    &mut launches,
                    &mut out.launches,
                    &self.launches[i as usize],
                )),
                Event::Gemm(i) => {
                    Event::Gemm(intern(&mut gemms, &mut out.gemms, &self.gemms[i as usize]))
                }
                other => other,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::{GemmCompute, GemmType};
    use super::*;

    fn one(size: u64) -> Profile {
        let mut p = Profile::new();
        p.kernels.push("k".into());
        let mut c = LaunchCounters {
            unique_sectors: 10 + 4 * size,
            ..LaunchCounters::default()
        };
        c.warp_instructions[0] = 7 * size;
        p.launches.push(LaunchRecord {
            kernel: 0,
            grid: [size as u32, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
            counters: c,
        });
        p.gemms.push(GemmRecord {
            entry: "cublasGemmEx".into(),
            transa: false,
            transb: false,
            m: 64,
            n: size,
            k: 9,
            batch: 1,
            ab_type: GemmType::F32,
            c_type: GemmType::F32,
            compute: GemmCompute::F32,
            ld: [64, 9, 64],
        });
        p.events = vec![Event::Launch(0), Event::Gemm(0), Event::HtoD(4 * size)];
        p
    }

    #[test]
    fn affine_counts_extrapolate_exactly() {
        let (a, b) = (one(1024), one(4096));
        let t = (50176.0 - 1024.0) / (4096.0 - 1024.0);
        let p = extrapolate(&a, &b, t).unwrap();
        assert_eq!(p, one(50176));
        let mut c = one(4096);
        c.events.pop();
        assert!(extrapolate(&a, &c, t).is_err());
    }
}
