//! Control-flow graph of one function and the immediate post-dominator of
//! every branch: the reconvergence point of the SIMT stack (the design of
//! GPGPU-Sim). Computed once at load time.

use super::ir::{Inst, Op, NO_PC};

/// Sets `rpc` of every `bra` in `code` (one function, whose first
/// instruction has index `base` in the module) to the first instruction of
/// the branch block's immediate post-dominator (or [`NO_PC`] when paths
/// meet only at exit). Fails (instruction index, message) when control can
/// fall off the end of the function.
pub(crate) fn set_reconvergence(code: &mut [Inst], base: u32) -> Result<(), (usize, String)> {
    let n = code.len();
    if n == 0 {
        return Err((0, "function has no instructions".into()));
    }
    // Leaders and blocks.
    let mut leader = vec![false; n + 1];
    leader[0] = true;
    for (i, inst) in code.iter().enumerate() {
        match inst.op {
            Op::Bra { target, .. } => {
                if target < base || (target - base) as usize >= n {
                    return Err((i, "branch to the end of the function".into()));
                }
                leader[(target - base) as usize] = true;
                leader[i + 1] = true;
            }
            Op::Ret | Op::Exit | Op::Trap => leader[i + 1] = true,
            _ => {}
        }
    }
    let starts: Vec<usize> = (0..n).filter(|&i| leader[i]).collect();
    let nb = starts.len();
    let mut block_of = vec![0usize; n];
    for (b, &s) in starts.iter().enumerate() {
        let e = starts.get(b + 1).copied().unwrap_or(n);
        block_of[s..e].fill(b);
    }
    let exit = nb;
    // Successors (in the original graph).
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); nb + 1];
    for b in 0..nb {
        let e = starts.get(b + 1).copied().unwrap_or(n);
        let last = &code[e - 1];
        let guarded = last.guard.is_some();
        let fall = |succ: &mut Vec<usize>| -> Result<(), (usize, String)> {
            if e == n {
                return Err((e - 1, "control can fall off the end of the function".into()));
            }
            succ.push(block_of[e]);
            Ok(())
        };
        match last.op {
            Op::Bra { target, .. } => {
                succ[b].push(block_of[(target - base) as usize]);
                if guarded {
                    fall(&mut succ[b])?;
                }
            }
            Op::Ret | Op::Exit | Op::Trap => {
                succ[b].push(exit);
                if guarded {
                    fall(&mut succ[b])?;
                }
            }
            _ => fall(&mut succ[b])?,
        }
    }
    let mut pred: Vec<Vec<usize>> = vec![Vec::new(); nb + 1];
    for b in 0..nb {
        for &s in &succ[b] {
            pred[s].push(b);
        }
    }
    // Post-dominators = dominators of the reversed graph rooted at exit
    // (Cooper, Harvey & Kennedy's iterative algorithm).
    let mut order = Vec::with_capacity(nb + 1); // postorder of the reverse graph
    let mut seen = vec![false; nb + 1];
    let mut stack = vec![(exit, 0usize)];
    seen[exit] = true;
    while let Some(&mut (v, ref mut k)) = stack.last_mut() {
        if *k < pred[v].len() {
            let w = pred[v][*k];
            *k += 1;
            if !seen[w] {
                seen[w] = true;
                stack.push((w, 0));
            }
        } else {
            order.push(v);
            stack.pop();
        }
    }
    let mut po = vec![usize::MAX; nb + 1];
    for (i, &v) in order.iter().enumerate() {
        po[v] = i;
    }
    let undef = usize::MAX;
    let mut ipdom = vec![undef; nb + 1];
    ipdom[exit] = exit;
    let mut changed = true;
    while changed {
        changed = false;
        for &v in order.iter().rev() {
            if v == exit {
                continue;
            }
            let mut new = undef;
            for &s in &succ[v] {
                if ipdom[s] == undef {
                    continue;
                }
                new = if new == undef {
                    s
                } else {
                    let (mut a, mut b) = (new, s);
                    while a != b {
                        while po[a] < po[b] {
                            a = ipdom[a];
                        }
                        while po[b] < po[a] {
                            b = ipdom[b];
                        }
                    }
                    a
                };
            }
            if new != undef && ipdom[v] != new {
                ipdom[v] = new;
                changed = true;
            }
        }
    }
    for (i, inst) in code.iter_mut().enumerate() {
        if let Op::Bra { ref mut rpc, .. } = inst.op {
            let p = ipdom[block_of[i]];
            *rpc = if p == undef || p == exit {
                NO_PC
            } else {
                base + starts[p] as u32
            };
        }
    }
    Ok(())
}
