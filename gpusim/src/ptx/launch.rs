//! A launch: argument checks, the parameter buffer, warps set up once and
//! reused for every block.

use super::exec::{Entry, Exec, Warp, WarpState};
use super::ir::NO_PC;
use super::{Fault, FaultKind, KernelId, LaunchDims, LaunchStats, Module};
use crate::memory::DeviceMemory;
use crate::profile::LaunchCounters;

/// Most threads in one block.
const MAX_BLOCK_THREADS: u64 = 1024;

pub(crate) fn launch(
    module: &Module,
    k: KernelId,
    dims: &LaunchDims,
    params: &[&[u8]],
    mem: &mut DeviceMemory,
    profile: bool,
) -> Result<(LaunchStats, Option<LaunchCounters>), Fault> {
    let bad = |kernel: &str, detail: String| Fault {
        kind: FaultKind::Trap,
        kernel: kernel.to_string(),
        block: [0; 3],
        thread: [0; 3],
        instruction: "(launch)".into(),
        address: None,
        detail,
    };
    let Some(&fi) = module.kernels.get(k.0) else {
        return Err(bad("?", format!("no kernel with id {}", k.0)));
    };
    let f = &module.d.funcs[fi];
    let name = f.name.as_str();
    if params.len() != f.kparams.len() {
        return Err(bad(
            name,
            format!(
                "{} parameters passed, the kernel takes {}",
                params.len(),
                f.kparams.len()
            ),
        ));
    }
    let mut kparams = vec![0u8; f.kparam_bytes as usize];
    for (i, (p, (off, spec))) in params.iter().zip(&f.kparams).enumerate() {
        if p.len() != spec.size {
            return Err(bad(
                name,
                format!(
                    "parameter {i} has {} bytes, the kernel declares {}",
                    p.len(),
                    spec.size
                ),
            ));
        }
        kparams[*off as usize..*off as usize + p.len()].copy_from_slice(p);
    }
    let nthreads = dims.block.iter().map(|&x| x as u64).product::<u64>();
    if nthreads == 0 || nthreads > MAX_BLOCK_THREADS || dims.grid.contains(&0) {
        return Err(bad(
            name,
            format!(
                "invalid launch shape: grid {:?}, block {:?}",
                dims.grid, dims.block
            ),
        ));
    }
    let nthreads = nthreads as u32;
    let nwarps = nthreads.div_ceil(32);
    // Dynamic shared memory starts at the kernel's aligned static end.
    let dynamic = dims.dynamic_shared_bytes as usize;
    let shared_bytes = match dynamic {
        0 => f.shared_bytes as usize,
        _ => f.dyn_shared_base as usize + dynamic,
    };
    let mut ex = Exec {
        m: &module.d,
        kernel: fi as u32,
        mem,
        kparams,
        dims: *dims,
        block: [0; 3],
        shared: Default::default(),
        stats: LaunchStats::default(),
        prof: profile.then(Box::default),
    };
    ex.shared.symbols = f.shared.clone();
    for n in &f.dyn_shared {
        let sym = format!("{n} (dynamic, {dynamic} bytes at launch)");
        ex.shared
            .symbols
            .push((sym, f.dyn_shared_base, dynamic as u32));
    }
    let mut warps: Vec<Warp> = (0..nwarps)
        .map(|id| {
            let n = (nthreads - id * 32).min(32);
            let valid = if n == 32 { !0 } else { (1u32 << n) - 1 };
            Warp {
                id,
                regs: vec![0; f.nslots as usize * 32],
                preds: vec![0; f.npreds as usize],
                stack: Vec::with_capacity(16),
                frames: Vec::new(),
                reg_base: 0,
                pred_base: 0,
                frame_base: 0,
                frame_top: f.frame_bytes,
                func: fi as u32,
                valid,
                exited: !valid,
                carry: 0,
                local: vec![0; f.frame_bytes as usize * 32],
                state: WarpState::Done,
            }
        })
        .collect();
    for w in &mut warps {
        ex.init_slots(w, fi as u32, 0, false);
    }
    for bz in 0..dims.grid[2] {
        for by in 0..dims.grid[1] {
            for bx in 0..dims.grid[0] {
                ex.block = [bx, by, bz];
                ex.shared.reset(shared_bytes);
                for w in &mut warps {
                    w.stack.clear();
                    w.stack.push(Entry {
                        pc: f.start,
                        rpc: NO_PC,
                        mask: w.valid,
                    });
                    w.frames.clear();
                    w.reg_base = 0;
                    w.pred_base = 0;
                    w.frame_base = 0;
                    w.frame_top = f.frame_bytes;
                    w.func = fi as u32;
                    w.exited = !w.valid;
                    w.carry = 0;
                    w.state = WarpState::Running;
                    ex.init_slots(w, fi as u32, 0, true);
                }
                ex.run_block(&mut warps)?;
            }
        }
    }
    Ok((ex.stats, ex.prof.map(|p| p.finish())))
}
