//! Placement rules broken on purpose (feature `fault-injection`), so that the allocator's property tests can show
//! that each property catches the rule it guards being flipped.

/// One rule to break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Stitched: never reuse an idle page elsewhere, neither by a move nor by the trim and retry after an OOM
    /// (what a segment allocator cannot do): only create pages, and fail at the page limit.
    NoPageReuse,
    /// Stitched: create pages while under the page limit, whatever the idle pages and the slack.
    CreateOverMove,
    /// Stitched: unmap a moved page's old mapping at once, whether or not the stream has passed its last use.
    UnmapBeforePassed,
    /// Segments: reserve a new region although a cached free chunk fits.
    GrowBeforeFit,
    /// Trim keeps one wholly free region (segments) or idle page (stitched).
    TrimKeepsOne,
    /// Not a broken rule: the parked-block fast path off, the reference its choices are checked against.
    NoParking,
}
