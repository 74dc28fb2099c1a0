//! One buffer written by many tasks, each in its own range.

/// A raw pointer to a buffer that may cross threads, because the tasks it is handed to touch disjoint ranges.
#[derive(Clone, Copy)]
pub(crate) struct Disjoint<T>(pub(crate) *mut T);

// SAFETY: only handed to tasks that touch disjoint ranges of the buffer (each use says which).
unsafe impl<T: Send> Send for Disjoint<T> {}
// SAFETY: as above; no two tasks touch the same element.
unsafe impl<T: Send> Sync for Disjoint<T> {}

impl<T> Disjoint<T> {
    /// The `len` elements from `start`.
    ///
    /// # Safety
    /// `start + len` must lie inside the buffer, the range must be initialised, and no other live reference may
    /// overlap it.
    pub(crate) unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [T] {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }

    /// The element at `offset`.
    ///
    /// # Safety
    /// `offset` must lie inside the buffer.
    pub(crate) unsafe fn at(self, offset: usize) -> *mut T {
        // SAFETY: guaranteed by the caller.
        unsafe { self.0.add(offset) }
    }
}
