//! Thread-local context for new allocations: their category and the layer scope.

use super::Category;
use std::cell::RefCell;

thread_local! {
    static CATEGORY: RefCell<Vec<Category>> = const { RefCell::new(Vec::new()) };
    static SCOPE: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The category that allocations made now on this thread are counted under.
pub fn current_category() -> Category {
    CATEGORY.with(|c| c.borrow().last().copied().unwrap_or(Category::Other))
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
    SCOPE.with(|s| s.borrow_mut().push(name.into()));
    ScopeGuard(())
}

/// The current layer path ("" outside any scope).
pub fn current_scope() -> String {
    SCOPE.with(|s| s.borrow().join("."))
}
