//! L-BFGS as `torch.optim.LBFGS`: limited-memory BFGS over every parameter
//! seen as one flat vector, driven by a closure that recomputes the loss
//! and the gradients, with a fixed step (`lr`) or the strong-Wolfe line
//! search.
//!
//! One [`Lbfgs::step`] runs up to `max_iter` iterations (and at most
//! `max_eval` closure calls). Each iteration: the two-loop recursion turns
//! the gradient into a direction `d` with the last `history_size` pairs
//! (`s` = step taken, `y` = gradient change; a pair enters only when
//! `yᵀs > 1e-10`, and scales the initial inverse Hessian to `yᵀs / yᵀy`);
//! the first iteration ever goes along `−g` with the step
//! `min(1, 1/‖g‖₁)·lr`, later ones with `lr`; it stops when `gᵀd` is not
//! a descent (`> −tolerance_change`), when every gradient element is at most
//! `tolerance_grad` in magnitude, when the step or the loss change falls
//! below `tolerance_change`, or when the budgets run out. The history
//! persists from one `step` to the next, as PyTorch's optimizer state does.
//!
//! Vectors (flat gradients, directions, the history) are tensors on the
//! parameters' device and in their dtype, counted as
//! [`Category::OptimizerState`]: `2·history_size + 3` parameter-sized
//! vectors at most. Scalars (dot products, step lengths) are in f64.
//!
//! ```
//! use leangrad::optim::{Lbfgs, LbfgsOptions, LineSearch};
//! use leangrad::{Device, Tensor};
//!
//! // Minimise (x − 3)² + (y + 1)².
//! let p = Tensor::from_vec(vec![0.0f64, 0.0], &[2], Device::Cpu)?.into_parameter()?;
//! let target = Tensor::from_vec(vec![3.0f64, -1.0], &[2], Device::Cpu)?;
//! let mut opt = Lbfgs::new([p.clone()], LbfgsOptions::new(1.0).line_search(LineSearch::StrongWolfe))?;
//! opt.step(|| {
//!     let loss = p.sub(&target)?.square()?.sum_all()?;
//!     loss.backward()?;
//!     loss.to_scalar()
//! })?;
//! let x = p.to_f64_vec()?;
//! assert!((x[0] - 3.0).abs() < 1e-6 && (x[1] + 1.0).abs() < 1e-6);
//! # Ok::<(), leangrad::Error>(())
//! ```

use crate::autograd::no_grad;
use crate::memory::{with_category, Category};
use crate::primitives::copy_into;
use crate::{DType, Device, Error, Result, Tensor};
use std::collections::VecDeque;

/// How [`Lbfgs`] picks the step length along each direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LineSearch {
    /// A fixed step: `lr` (PyTorch's `line_search_fn=None`).
    #[default]
    None,
    /// A line search satisfying the strong Wolfe conditions (sufficient
    /// decrease `c₁ = 1e-4`, curvature `c₂ = 0.9`, cubic interpolation),
    /// as PyTorch's `line_search_fn="strong_wolfe"`.
    StrongWolfe,
}

/// L-BFGS hyper-parameters, with `torch.optim.LBFGS`'s meaning and
/// defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct LbfgsOptions {
    /// Step length (the first iteration scales it by `min(1, 1/‖g‖₁)`).
    pub lr: f64,
    /// Iterations per [`Lbfgs::step`].
    pub max_iter: usize,
    /// Closure calls per [`Lbfgs::step`]; `None` is `max_iter · 5 / 4`.
    pub max_eval: Option<usize>,
    /// Stop when every gradient element is at most this in magnitude.
    pub tolerance_grad: f64,
    /// Stop when the step, the loss change or the descent fall below this.
    pub tolerance_change: f64,
    /// Curvature pairs kept.
    pub history_size: usize,
    /// Fixed step or strong-Wolfe line search.
    pub line_search: LineSearch,
}

impl LbfgsOptions {
    /// PyTorch's defaults with learning rate `lr`: 20 iterations, 25
    /// evaluations, tolerances 1e-7 (gradient) and 1e-9 (change), a
    /// history of 100, no line search.
    pub fn new(lr: f64) -> LbfgsOptions {
        LbfgsOptions {
            lr,
            max_iter: 20,
            max_eval: None,
            tolerance_grad: 1e-7,
            tolerance_change: 1e-9,
            history_size: 100,
            line_search: LineSearch::None,
        }
    }

    /// With `max_iter` iterations per step.
    pub fn max_iter(mut self, max_iter: usize) -> Self {
        self.max_iter = max_iter;
        self
    }

    /// With `history_size` curvature pairs.
    pub fn history_size(mut self, history_size: usize) -> Self {
        self.history_size = history_size;
        self
    }

    /// With this line search.
    pub fn line_search(mut self, line_search: LineSearch) -> Self {
        self.line_search = line_search;
        self
    }

    /// The evaluation budget of one step.
    pub fn evaluations(&self) -> usize {
        self.max_eval.unwrap_or(self.max_iter * 5 / 4)
    }
}

/// The curvature pairs, oldest first.
#[derive(Default)]
struct History {
    /// Gradient changes `y`.
    dirs: VecDeque<Tensor>,
    /// Steps `s`.
    steps: VecDeque<Tensor>,
    /// `1 / yᵀs` of each pair.
    ro: VecDeque<f64>,
    /// The initial inverse Hessian's scale.
    h_diag: f64,
}

/// L-BFGS over a list of parameters (leaves requiring grad, one dtype, one
/// device), as `torch.optim.LBFGS`.
pub struct Lbfgs {
    params: Vec<Tensor>,
    options: LbfgsOptions,
    func_evals: usize,
    n_iter: usize,
    /// The last direction and step length.
    d: Option<Tensor>,
    t: f64,
    history: History,
    prev_flat_grad: Option<Tensor>,
}

impl Lbfgs {
    /// An optimizer over `params` (every one a leaf requiring grad, all of
    /// one float dtype on one device).
    pub fn new(params: impl IntoIterator<Item = Tensor>, options: LbfgsOptions) -> Result<Lbfgs> {
        let params: Vec<Tensor> = params.into_iter().collect();
        let bad = |msg: String| Err(Error::InvalidArgument { op: "LBFGS", msg });
        if options.lr.is_nan() || options.lr < 0.0 {
            return bad(format!("invalid learning rate {}", options.lr));
        }
        if options.max_iter == 0 || options.history_size == 0 {
            return bad("max_iter and history_size must be at least 1".into());
        }
        for p in &params {
            if !p.dtype().is_float() {
                return Err(Error::UnsupportedDType {
                    op: "LBFGS",
                    dtype: p.dtype(),
                });
            }
            if p.leaf_id().is_none() {
                return bad("can only optimize leaf tensors that require grad".into());
            }
            if (p.dtype(), p.device()) != (params[0].dtype(), params[0].device()) {
                return bad("every parameter must have the same dtype and device".into());
            }
        }
        Ok(Lbfgs {
            params,
            options,
            func_evals: 0,
            n_iter: 0,
            d: None,
            t: 0.0,
            history: History::default(),
            prev_flat_grad: None,
        })
    }

    /// The hyper-parameters.
    pub fn options(&self) -> &LbfgsOptions {
        &self.options
    }

    /// Closure calls so far, over every step (PyTorch's `func_evals`).
    pub fn func_evals(&self) -> usize {
        self.func_evals
    }

    /// Iterations so far, over every step (PyTorch's `n_iter`).
    pub fn iterations(&self) -> usize {
        self.n_iter
    }

    /// Bytes of the kept vectors (history, last direction and gradient).
    pub fn state_bytes(&self) -> usize {
        let h = &self.history;
        h.dirs
            .iter()
            .chain(&h.steps)
            .chain(&self.d)
            .chain(&self.prev_flat_grad)
            .map(Tensor::storage_bytes)
            .sum()
    }

    /// One optimisation step of up to `max_iter` iterations. `closure`
    /// recomputes the loss, calls `backward` on it and returns its value;
    /// the parameters' `.grad`s are freed before each call (as a PyTorch
    /// closure's `zero_grad` does) and read (and freed) after it. Returns
    /// the loss of the first evaluation, at the parameters as they were.
    pub fn step(&mut self, mut closure: impl FnMut() -> Result<f64>) -> Result<f64> {
        if self.params.is_empty() {
            return closure();
        }
        let o = self.options.clone();
        let max_eval = o.evaluations();
        let (orig_loss, mut flat_grad) = evaluate(&self.params, &mut closure)?;
        let mut loss = orig_loss;
        let mut current_evals = 1;
        self.func_evals += 1;
        if abs_max(&flat_grad)? <= o.tolerance_grad {
            return Ok(orig_loss);
        }
        let mut n_iter = 0;
        while n_iter < o.max_iter {
            n_iter += 1;
            self.n_iter += 1;
            let d = if self.n_iter == 1 {
                self.history = History {
                    h_diag: 1.0,
                    ..History::default()
                };
                in_state(|| flat_grad.neg())?
            } else {
                self.direction(&flat_grad)?
            };
            self.d = Some(d.clone());
            self.prev_flat_grad = Some(flat_grad.clone());
            let prev_loss = loss;
            let mut t = if self.n_iter == 1 {
                (1.0 / abs_sum(&flat_grad)?).min(1.0) * o.lr
            } else {
                o.lr
            };
            self.t = t;
            let gtd = dot(&flat_grad, &d)?;
            if gtd > -o.tolerance_change {
                break;
            }
            let mut evals = 0;
            let mut optimal = false;
            match o.line_search {
                LineSearch::StrongWolfe => {
                    let params = &self.params;
                    let x_init =
                        in_state(|| params.iter().map(copy_of).collect::<Result<Vec<_>>>())?;
                    let mut along = |t: f64| directional(params, &mut closure, &x_init, t, &d);
                    let budget = max_eval.saturating_sub(current_evals);
                    let found = strong_wolfe(&mut along, t, &d, (loss, &flat_grad, gtd), budget)?;
                    (loss, flat_grad, t, evals) = found;
                    self.t = t;
                    add_along(&self.params, t, &d)?;
                    optimal = abs_max(&flat_grad)? <= o.tolerance_grad;
                }
                LineSearch::None => {
                    add_along(&self.params, t, &d)?;
                    if n_iter != o.max_iter {
                        (loss, flat_grad) = evaluate(&self.params, &mut closure)?;
                        optimal = abs_max(&flat_grad)? <= o.tolerance_grad;
                        evals = 1;
                    }
                }
            }
            current_evals += evals;
            self.func_evals += evals;
            if n_iter == o.max_iter || current_evals >= max_eval || optimal {
                break;
            }
            if abs_max(&d)? * t.abs() <= o.tolerance_change {
                break;
            }
            if (loss - prev_loss).abs() < o.tolerance_change {
                break;
            }
        }
        Ok(orig_loss)
    }

    /// The two-loop recursion: updates the history with the last step and
    /// gradient change, then returns `−H·g`.
    fn direction(&mut self, flat_grad: &Tensor) -> Result<Tensor> {
        let (Some(prev), Some(d)) = (&self.prev_flat_grad, &self.d) else {
            return Err(Error::InvalidArgument {
                op: "LBFGS",
                msg: "no previous iteration to build the history from".into(),
            });
        };
        let (t, history_size) = (self.t, self.options.history_size);
        let h = &mut self.history;
        in_state(|| {
            let y = flat_grad.sub(prev)?;
            let s = d.mul_scalar(t)?;
            let ys = dot(&y, &s)?;
            if ys > 1e-10 {
                if h.dirs.len() == history_size {
                    h.dirs.pop_front();
                    h.steps.pop_front();
                    h.ro.pop_front();
                }
                h.h_diag = ys / dot(&y, &y)?;
                h.dirs.push_back(y);
                h.steps.push_back(s);
                h.ro.push_back(1.0 / ys);
            }
            let n = h.dirs.len();
            let mut al = vec![0.0; n];
            let q = flat_grad.neg()?;
            for i in (0..n).rev() {
                al[i] = dot(&h.steps[i], &q)? * h.ro[i];
                q.add_(&h.dirs[i].mul_scalar(-al[i])?)?;
            }
            let r = q.mul_scalar(h.h_diag)?;
            let pairs = h.dirs.iter().zip(&h.steps).zip(&h.ro);
            for (((y, s), ro), a) in pairs.zip(&al) {
                let be = dot(y, &r)? * ro;
                r.add_(&s.mul_scalar(a - be)?)?;
            }
            Ok(r)
        })
    }
}

/// Runs `f` without recording, with its allocations counted as optimizer
/// state.
fn in_state<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let _category = with_category(Category::OptimizerState);
    let _no_grad = no_grad();
    f()
}

fn dot(a: &Tensor, b: &Tensor) -> Result<f64> {
    a.mul(b)?.sum_all()?.to_scalar()
}

fn abs_max(a: &Tensor) -> Result<f64> {
    if a.numel() == 0 {
        return Ok(0.0);
    }
    in_state(|| a.abs()?.max(0, false)?.to_scalar())
}

fn abs_sum(a: &Tensor) -> Result<f64> {
    in_state(|| a.abs()?.sum_all()?.to_scalar())
}

/// A contiguous copy of `p`'s values.
fn copy_of(p: &Tensor) -> Result<Tensor> {
    let copy = Tensor::zeros(p.shape(), p.dtype(), p.device())?;
    copy_into(&copy, &p.detach())?;
    Ok(copy)
}

/// Frees the parameters' gradients, calls the closure, and returns its
/// loss with the gradients gathered into one flat vector (zeros for a
/// parameter that got none).
fn evaluate(params: &[Tensor], closure: &mut impl FnMut() -> Result<f64>) -> Result<(f64, Tensor)> {
    for p in params {
        p.zero_grad();
    }
    let loss = closure()?;
    let flat = in_state(|| {
        let (dtype, device): (DType, Device) = (params[0].dtype(), params[0].device());
        let views = params
            .iter()
            .map(|p| match p.take_grad() {
                Some(g) => g.reshape(&[p.numel()]),
                None => Tensor::zeros(&[p.numel()], dtype, device),
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&views.iter().collect::<Vec<_>>(), 0)?.contiguous()
    })?;
    Ok((loss, flat))
}

/// `p += t · d[p's slice]` for every parameter.
fn add_along(params: &[Tensor], t: f64, d: &Tensor) -> Result<()> {
    in_state(|| {
        let mut offset = 0;
        for p in params {
            let n = p.numel();
            let slice = d.narrow(0, offset, n)?.reshape(p.shape())?;
            p.add_(&slice.mul_scalar(t)?)?;
            offset += n;
        }
        Ok(())
    })
}

/// The loss and flat gradient at `x + t·d`; the parameters are put back to
/// `x` afterwards.
fn directional(
    params: &[Tensor],
    closure: &mut impl FnMut() -> Result<f64>,
    x: &[Tensor],
    t: f64,
    d: &Tensor,
) -> Result<(f64, Tensor)> {
    add_along(params, t, d)?;
    let result = evaluate(params, closure)?;
    in_state(|| {
        for (p, saved) in params.iter().zip(x) {
            copy_into(&p.detach(), saved)?;
        }
        Ok(())
    })?;
    Ok(result)
}

/// The minimiser of the cubic through `(x1, f1)` and `(x2, f2)` with
/// slopes `g1`, `g2`, clamped to `bounds` (default: between the two
/// points); their midpoint when the cubic has no minimum.
fn cubic_interpolate(
    (x1, f1, g1): (f64, f64, f64),
    (x2, f2, g2): (f64, f64, f64),
    bounds: Option<(f64, f64)>,
) -> f64 {
    let (lo, hi) = bounds.unwrap_or(if x1 <= x2 { (x1, x2) } else { (x2, x1) });
    let d1 = g1 + g2 - 3.0 * (f1 - f2) / (x1 - x2);
    let d2_square = d1 * d1 - g1 * g2;
    if d2_square >= 0.0 {
        let d2 = d2_square.sqrt();
        let min_pos = if x1 <= x2 {
            x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2.0 * d2))
        } else {
            x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2.0 * d2))
        };
        min_pos.max(lo).min(hi)
    } else {
        (lo + hi) / 2.0
    }
}

/// One end of the line search's bracket: step, loss, gradient, slope.
#[derive(Clone)]
struct Point {
    t: f64,
    f: f64,
    g: Tensor,
    gtd: f64,
}

/// Searches along `d` from the current point (loss `f`, gradient `g`,
/// slope `gtd`) for a step satisfying the strong Wolfe conditions, with at
/// most `max_ls` further evaluations after the first. Returns the loss,
/// gradient and step found and the evaluations made.
fn strong_wolfe(
    along: &mut dyn FnMut(f64) -> Result<(f64, Tensor)>,
    t: f64,
    d: &Tensor,
    (f, g, gtd): (f64, &Tensor, f64),
    max_ls: usize,
) -> Result<(f64, Tensor, f64, usize)> {
    const C1: f64 = 1e-4;
    const C2: f64 = 0.9;
    const TOLERANCE_CHANGE: f64 = 1e-9;
    let d_norm = abs_max(d)?;
    let mut t = t;
    let (f_new, g_new) = along(t)?;
    let mut new = Point {
        t,
        gtd: dot(&g_new, d)?,
        f: f_new,
        g: g_new,
    };
    let mut evals = 1;
    let mut prev = Point {
        t: 0.0,
        f,
        g: g.clone(),
        gtd,
    };
    let mut done = false;
    let mut ls_iter = 0;
    // Bracketing: grow the step until the bracket [prev, new] holds a
    // point satisfying the conditions (or `new` satisfies them).
    let mut bracket: Vec<Point> = Vec::new();
    while ls_iter < max_ls {
        if new.f > f + C1 * t * gtd || (ls_iter > 1 && new.f >= prev.f) {
            bracket = vec![prev.clone(), new.clone()];
            break;
        }
        if new.gtd.abs() <= -C2 * gtd {
            bracket = vec![new.clone()];
            done = true;
            break;
        }
        if new.gtd >= 0.0 {
            bracket = vec![prev.clone(), new.clone()];
            break;
        }
        let bounds = (t + 0.01 * (t - prev.t), t * 10.0);
        t = cubic_interpolate(
            (prev.t, prev.f, prev.gtd),
            (t, new.f, new.gtd),
            Some(bounds),
        );
        prev = new;
        let (f_new, g_new) = along(t)?;
        new = Point {
            t,
            gtd: dot(&g_new, d)?,
            f: f_new,
            g: g_new,
        };
        evals += 1;
        ls_iter += 1;
    }
    if ls_iter == max_ls {
        bracket = vec![
            Point {
                t: 0.0,
                f,
                g: g.clone(),
                gtd,
            },
            new,
        ];
    }
    // Zoom: shrink the bracket until a point satisfies the conditions.
    let order = |b: &[Point]| {
        if b[0].f <= b[b.len() - 1].f {
            (0, 1)
        } else {
            (1, 0)
        }
    };
    let (mut low, mut high) = order(&bracket);
    let mut insufficient_progress = false;
    while !done && ls_iter < max_ls {
        let (lo_t, hi_t) = (
            bracket[0].t.min(bracket[1].t),
            bracket[0].t.max(bracket[1].t),
        );
        if (bracket[1].t - bracket[0].t).abs() * d_norm < TOLERANCE_CHANGE {
            break;
        }
        let (a, b) = (&bracket[0], &bracket[1]);
        t = cubic_interpolate((a.t, a.f, a.gtd), (b.t, b.f, b.gtd), None);
        // Keep the trial away from the bracket's ends, unless the last
        // trial was already close and made progress.
        let eps = 0.1 * (hi_t - lo_t);
        if (hi_t - t).min(t - lo_t) < eps {
            if insufficient_progress || t >= hi_t || t <= lo_t {
                t = if (t - hi_t).abs() < (t - lo_t).abs() {
                    hi_t - eps
                } else {
                    lo_t + eps
                };
                insufficient_progress = false;
            } else {
                insufficient_progress = true;
            }
        } else {
            insufficient_progress = false;
        }
        let (f_new, g_new) = along(t)?;
        let trial = Point {
            t,
            gtd: dot(&g_new, d)?,
            f: f_new,
            g: g_new,
        };
        evals += 1;
        ls_iter += 1;
        if trial.f > f + C1 * t * gtd || trial.f >= bracket[low].f {
            bracket[high] = trial;
            (low, high) = order(&bracket);
        } else {
            if trial.gtd.abs() <= -C2 * gtd {
                done = true;
            } else if trial.gtd * (bracket[high].t - bracket[low].t) >= 0.0 {
                bracket[high] = bracket[low].clone();
            }
            bracket[low] = trial;
        }
    }
    let best = bracket.swap_remove(low);
    Ok((best.f, best.g, best.t, evals))
}
