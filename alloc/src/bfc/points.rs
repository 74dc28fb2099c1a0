//! The stitched layout's view of the stream: points recorded on it mark pages' last uses, so that a page's old
//! mapping is removed only once the stream has passed its point (PyTorch defers a block's reuse across streams the
//! same way), and the allocator waits for the stream only where a block lands on such a mapping too soon, or a
//! trim must give everything back.
//!
//! A point is recorded lazily, at a page fault or a trim that finds pages freed since the last one: one event
//! covers every page freed before it, and a cached allocation or free makes no driver call.

use super::{Inner, PlaceError, source_error};
use crate::fault::Fault;
use crate::source::MemorySource;

impl<S: MemorySource> Inner<S> {
    /// Brings the page table up to date with the stream without waiting: records a point for pages freed since the
    /// last one (when `record`; a capturing stream must not get one), then asks how far the stream has got.
    pub(super) fn refresh_points(&mut self, record: bool) -> Result<(), PlaceError> {
        let pt = self
            .pages
            .as_mut()
            .expect("stitched layout has a page table");
        if pt.pending() == 0 && pt.retired == 0 {
            return Ok(());
        }
        let paged = self
            .source
            .paged()
            .expect("stitched layout has a paged source");
        if record && pt.wants_point() {
            let n = paged
                .record_point()
                .map_err(|e| PlaceError::Fatal(source_error(e, "record_point")))?;
            pt.recorded(n);
        }
        pt.pass(paged.passed_point());
        Ok(())
    }

    /// Makes every idle page ready and every retired one unmappable, waiting for the stream where it has not
    /// passed them.
    pub(super) fn settle_points(&mut self) -> Result<(), PlaceError> {
        self.refresh_points(true)?;
        let newest = self.pages.as_ref().expect("page table").newest_point();
        self.wait_point(newest)
    }

    /// Unmaps, in runs, the retired pages whose last use the stream has passed. A failure is logged, and the page
    /// stays retired.
    pub(super) fn unmap_retired(&mut self) {
        let only_passed = !self.faulty(Fault::UnmapBeforePassed);
        let pt = self.pages.as_ref().expect("page table");
        if pt.retired == 0 {
            return;
        }
        let mut retired = std::mem::take(&mut self.scratch_pages);
        pt.retired_passed(only_passed, &mut retired);
        let mut k = 0;
        while k < retired.len() {
            let start = retired[k];
            let mut n = 1;
            while k + (n as usize) < retired.len() && retired[k + n as usize] == start + n {
                n += 1;
            }
            k += n as usize;
            let va = self.pages.as_ref().expect("page table").va(start);
            let paged = self.source.paged().expect("paged source");
            match paged.unmap(va, u64::from(n)) {
                Ok(()) => {
                    let pt = self.pages.as_mut().expect("page table");
                    for p in start..start + n {
                        pt.unretire(p);
                    }
                    self.c.unmap_calls += 1;
                }
                Err(e) => tracing::error!(
                    "unmapping {n} retired pages at {va:#x}: {}",
                    source_error(e, "unmap")
                ),
            }
        }
        self.scratch_pages = retired;
    }

    /// Waits for the stream to pass `point` (recording it first if it is the next to come) and counts the wait;
    /// nothing to do for point 0.
    pub(super) fn wait_point(&mut self, point: u64) -> Result<(), PlaceError> {
        let pt = self.pages.as_mut().expect("page table");
        if point <= pt.passed {
            return Ok(());
        }
        let paged = self.source.paged().expect("paged source");
        let fatal = |call| move |e| PlaceError::Fatal(source_error(e, call));
        if point >= pt.next_point {
            let n = paged.record_point().map_err(fatal("record_point"))?;
            pt.recorded(n);
        }
        if point > paged.passed_point() {
            paged.wait_point(point).map_err(fatal("wait_point"))?;
            self.c.stream_waits += 1;
        }
        pt.pass(paged.passed_point().max(point));
        Ok(())
    }
}
