//! Thread-local context for new allocations: their category, the layer
//! scope, and the op running now (for the peak report and the timeline).

use super::Category;
use std::cell::{Cell, RefCell};
use std::sync::Arc;

thread_local! {
    static CATEGORY: RefCell<Vec<Category>> = const { RefCell::new(Vec::new()) };
    /// Full layer paths, innermost last (joined once, on entry; `None`: a
    /// recompute's return to the top level).
    static SCOPE: RefCell<Vec<Option<Arc<str>>>> = const { RefCell::new(Vec::new()) };
    /// Scopes that allocations are attributed to instead of `SCOPE` (backward
    /// runs each node under the scope that recorded it).
    static ATTRIBUTED: RefCell<Vec<Option<Arc<str>>>> = const { RefCell::new(Vec::new()) };
    /// The kernel (or backward node) running now.
    static OP: Cell<&'static str> = const { Cell::new("") };
}

/// The category that allocations made now on this thread are counted under.
pub fn current_category() -> Category {
    CATEGORY.with(|c| c.borrow().last().copied().unwrap_or(Category::Activation))
}

/// Restores the previous allocation category when dropped.
pub struct CategoryGuard(());

impl Drop for CategoryGuard {
    fn drop(&mut self) {
        CATEGORY.with(|c| c.borrow_mut().pop());
    }
}

/// Counts allocations made on this thread under `category` until the guard drops.
pub fn with_category(category: Category) -> CategoryGuard {
    CATEGORY.with(|c| c.borrow_mut().push(category));
    CategoryGuard(())
}

/// Pops the layer scope when dropped.
pub struct ScopeGuard(());

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        SCOPE.with(|s| s.borrow_mut().pop());
    }
}

/// Names the layer that ops run now belong to; scopes nest with '.' (like
/// PyTorch module paths). Saved tensors are reported under this name.
pub fn scope(name: impl Into<String>) -> ScopeGuard {
    let name = name.into();
    SCOPE.with(|s| {
        let mut s = s.borrow_mut();
        let path: Arc<str> = match s.last() {
            Some(Some(parent)) => Arc::from(format!("{parent}.{name}")),
            _ => Arc::from(name),
        };
        s.push(Some(path));
    });
    ScopeGuard(())
}

/// Makes `path` (a [`current_scope_path`] taken earlier; `None`: outside
/// any layer) the current layer path until the guard drops, whatever the
/// scopes open now: a checkpointed segment's recompute runs in backward
/// under the path its forward ran under.
pub fn enter_scope_path(path: Option<Arc<str>>) -> ScopeGuard {
    SCOPE.with(|s| s.borrow_mut().push(path));
    ScopeGuard(())
}

/// The current layer path ("" outside any scope).
pub fn current_scope() -> String {
    current_scope_path().map_or_else(String::new, |p| p.to_string())
}

/// The current layer path, shared (`None` outside any scope): what an
/// autograd node keeps so that its backward is attributed to its layer.
pub fn current_scope_path() -> Option<Arc<str>> {
    SCOPE.with(|s| s.borrow().last().cloned().flatten())
}

/// Ends an [`attribute_to_scope`] when dropped.
pub struct AttributionGuard(());

impl Drop for AttributionGuard {
    fn drop(&mut self) {
        ATTRIBUTED.with(|a| a.borrow_mut().pop());
    }
}

/// Attributes allocations made now on this thread to the layer path `path`
/// (none: outside any layer) in the peak report and the timeline, until the
/// guard drops. Saved-tensor labels still follow [`scope`]: backward uses
/// this to put each node's allocations under the layer that recorded it.
pub fn attribute_to_scope(path: Option<Arc<str>>) -> AttributionGuard {
    ATTRIBUTED.with(|a| a.borrow_mut().push(path));
    AttributionGuard(())
}

/// Names the op (a kernel, or a backward node) that runs now on this
/// thread, for the peak report and the timeline. The kernel seam calls it
/// for every kernel; it stays until the next call.
pub fn note_op(op: &'static str) {
    // Tolerates a thread being torn down (nothing to name then).
    let _ = OP.try_with(|o| o.set(op));
}

/// The layer path and op allocations made now are attributed to.
pub(crate) fn current_site() -> (Option<Arc<str>>, &'static str) {
    let attributed = ATTRIBUTED
        .try_with(|a| a.borrow().last().cloned())
        .ok()
        .flatten();
    let scope = match attributed {
        Some(path) => path,
        None => SCOPE
            .try_with(|s| s.borrow().last().cloned().flatten())
            .ok()
            .flatten(),
    };
    let op = OP.try_with(|o| o.get()).unwrap_or("");
    (scope, op)
}
