//! `memory.png`: for each member, in its own colour, its live bytes (a solid line), its reserved bytes (a lighter
//! line: what the pool held on its behalf), its limit (dashed), an × at each of its out-of-memory events and a
//! square at each batch change (with the new batch); on a GPU the pool's reserved bytes and its limit in dark grey;
//! a legend on the right. Drawn from a [`Timeline`], the records' pure function.

use std::path::Path;

use super::canvas::{BLACK, Canvas, Frame, H, PALETTE, PlotSpec, W, lighter};
use crate::error::Result;
use crate::memory_timeline::Timeline;
use crate::report::bytes;

/// The legend's panel, right of the plot.
const LEGEND: i64 = 236;
/// How much lighter the reserved line is than the member's live one.
pub const RESERVED_SHADE: f64 = 0.55;
/// The pool's lines.
pub const POOL: [u8; 3] = [40, 40, 40];
/// The legend's samples of the line styles.
const KEY: [u8; 3] = [110, 110, 110];
/// A limit more than this many times the largest figure drawn would flatten every line against the x axis: it is
/// named in the legend ("above") instead of drawn.
const ON_SCALE: f64 = 4.0;
const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];

/// Where the memory plot puts things: its frame (y in `unit`s of bytes) and the unit's name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layout {
    /// The plot area and the ranges it shows.
    pub frame: Frame,
    /// Bytes per unit of the y axis (1024ⁿ).
    pub unit: u64,
    /// The unit's name (`MiB`).
    pub unit_name: &'static str,
}

impl Layout {
    /// The pixel of `bytes` at `seconds`.
    pub fn px(&self, seconds: f64, bytes: u64) -> (i64, i64) {
        self.frame.px(seconds, bytes as f64 / self.unit as f64)
    }

    /// Whether a line at `bytes` is inside the plot (limits above it are named in the legend).
    pub fn on_scale(&self, bytes: u64) -> bool {
        bytes as f64 / self.unit as f64 <= self.frame.y.1
    }
}

/// The plot's layout for `t`: the time range recorded; bytes from 0 to the most any line reached, limits included
/// unless one is far above everything else.
pub fn layout(t: &Timeline) -> Layout {
    let most = |s: &[(f64, u64)]| s.iter().map(|p| p.1).max().unwrap_or(0);
    let mut data = most(&t.device.pool_reserved);
    for m in &t.members {
        data = data.max(most(&m.live)).max(most(&m.reserved));
        data = data.max(m.ooms().map(|o| o.bytes).max().unwrap_or(0));
    }
    let limits = t
        .members
        .iter()
        .flat_map(|m| m.limits.iter().map(|s| s.bytes))
        .chain(t.device.pool_limit.iter().map(|p| p.1));
    let top = limits
        .filter(|&l| data == 0 || l as f64 <= data as f64 * ON_SCALE)
        .fold(data, u64::max)
        .max(1);
    let k = (0..UNITS.len())
        .rev()
        .find(|&k| top >= 1u64 << (10 * k))
        .unwrap_or(0);
    let unit = 1u64 << (10 * k);
    let (x0, mut x1) = t.time_range();
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    Layout {
        frame: Frame {
            left: super::LEFT,
            top: super::TOP,
            right: W as i64 - LEGEND,
            bottom: H as i64 - super::BOTTOM,
            x: (x0, x1),
            y: (0.0, top as f64 / unit as f64 * 1.08),
        },
        unit,
        unit_name: UNITS[k],
    }
}

/// What a mark on the plot stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    /// An out-of-memory event (an ×).
    OutOfMemory,
    /// A batch change to `to` (a square, labelled with the new batch).
    Batch {
        /// The new batch.
        to: usize,
    },
}

/// A mark of a member's event, where the plot draws it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mark {
    /// The member's index in the timeline (its colour).
    pub member: usize,
    /// What happened.
    pub kind: MarkKind,
    /// Seconds into the run.
    pub time: f64,
    /// The height it is drawn at.
    pub bytes: u64,
}

/// `series` at time `t`: interpolated between its points, its first or last value outside them.
fn value_at(series: &[(f64, u64)], t: f64) -> Option<u64> {
    let (first, last) = (series.first()?, series.last()?);
    if t <= first.0 {
        return Some(first.1);
    }
    if t >= last.0 {
        return Some(last.1);
    }
    let k = series.partition_point(|p| p.0 <= t);
    let ((t0, a), (t1, b)) = (series[k - 1], series[k]);
    let share = if t1 > t0 { (t - t0) / (t1 - t0) } else { 0.0 };
    Some((a as f64 + (b as f64 - a as f64) * share).round() as u64)
}

/// Where the plot marks each member's events: an out-of-memory event on the member's limit line, which it ran
/// into (on its live line where no limit of it is drawn: the device was full, or its limit is far above); a batch
/// change on its live line. (The records' own figure, what the member held when it happened, is 0 for an OOM
/// before its first step.)
pub fn marks(t: &Timeline, l: &Layout) -> Vec<Mark> {
    let mut out = Vec::new();
    for (member, m) in t.members.iter().enumerate() {
        let live = |time: f64, held: u64| value_at(&m.live, time).unwrap_or(held);
        for b in &m.batch_changes {
            out.push(Mark {
                member,
                kind: MarkKind::Batch { to: b.to },
                time: b.time,
                bytes: live(b.time, b.bytes),
            });
        }
        for o in m.ooms() {
            let limit = m
                .limits
                .iter()
                .find(|s| s.from <= o.time && o.time <= s.to && l.on_scale(s.bytes));
            out.push(Mark {
                member,
                kind: MarkKind::OutOfMemory,
                time: o.time,
                bytes: limit.map_or_else(|| live(o.time, o.bytes), |s| s.bytes),
            });
        }
    }
    out
}

/// Draws `t` into `path` (PNG, 960×540).
///
/// # Errors
/// [`crate::Error::Plot`] or an I/O error when the file cannot be written.
pub fn plot(path: &Path, t: &Timeline) -> Result<()> {
    let l = layout(t);
    let mut cv = Canvas::new();
    let y_label = format!("memory ({})", l.unit_name);
    l.frame.draw_axes(
        &mut cv,
        &PlotSpec {
            title: "memory by member",
            x_label: "time (s)",
            y_label: &y_label,
        },
    );
    let line =
        |s: &[(f64, u64)]| -> Vec<(i64, i64)> { s.iter().map(|&(x, b)| l.px(x, b)).collect() };
    // The pool first, behind the members.
    cv.polyline(&line(&t.device.pool_reserved), POOL);
    for w in t.device.pool_limit.windows(2) {
        let (a, b) = (w[0], w[1]);
        if l.on_scale(a.1) {
            cv.dashed(l.px(a.0, a.1), l.px(b.0, a.1), POOL, true);
        }
    }
    for (i, m) in t.members.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        for s in m.limits.iter().filter(|s| l.on_scale(s.bytes)) {
            cv.dashed(l.px(s.from, s.bytes), l.px(s.to, s.bytes), c, true);
        }
        cv.polyline(&line(&m.reserved), lighter(c, RESERVED_SHADE));
        cv.polyline(&line(&m.live), c);
    }
    // Marks on top of every line; a batch's label only where it does not overwrite the member's previous one.
    let mut labelled: Vec<i64> = vec![i64::MIN; t.members.len()];
    for mark in marks(t, &l) {
        let c = PALETTE[mark.member % PALETTE.len()];
        let p = l.px(mark.time, mark.bytes);
        match mark.kind {
            MarkKind::OutOfMemory => cv.cross(p, 5, c),
            MarkKind::Batch { to } => {
                cv.square(p, 4, c);
                let text = to.to_string();
                if p.0 + 6 > labelled[mark.member] {
                    cv.text(p.0 + 6, p.1 - 14, &text, 1, c);
                    labelled[mark.member] = p.0 + 6 + Canvas::text_width(&text, 1) + 4;
                }
            }
        }
    }
    legend(&mut cv, &l, t);
    cv.write_png(path)
}

/// The legend: each member's colour and name (and its limit), then the line styles and marks.
fn legend(cv: &mut Canvas, l: &Layout, t: &Timeline) {
    let x = l.frame.right + 20;
    let mut y = l.frame.top;
    let room = ((W as i64 - x - 24) / 6) as usize;
    let fit = |s: String| s.chars().take(room).collect::<String>();
    for (i, m) in t.members.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        cv.rect(x, y, 16, 7, c);
        cv.text(x + 22, y, &fit(m.name.clone()), 1, BLACK);
        y += 12;
        if let Some(s) = m.limits.last() {
            let above = if l.on_scale(s.bytes) { "" } else { ", above" };
            cv.text(
                x + 22,
                y,
                &fit(format!("limit {}{above}", bytes(s.bytes))),
                1,
                KEY,
            );
            y += 12;
        }
        y += 2;
    }
    y += 10;
    let sample = |cv: &mut Canvas, y: i64, label: &str| cv.text(x + 22, y, label, 1, BLACK);
    cv.line((x, y + 3), (x + 16, y + 3), KEY, true);
    sample(cv, y, "live");
    y += 14;
    cv.line(
        (x, y + 3),
        (x + 16, y + 3),
        lighter(KEY, RESERVED_SHADE),
        true,
    );
    sample(cv, y, "reserved (peak or reserve)");
    y += 14;
    cv.dashed((x - 4, y + 3), (x + 16, y + 3), KEY, true);
    sample(cv, y, "limit");
    y += 14;
    cv.cross((x + 8, y + 3), 4, KEY);
    sample(cv, y, "out of memory");
    y += 14;
    cv.square((x + 8, y + 3), 3, KEY);
    sample(cv, y, "batch change (new batch)");
    y += 14;
    if !t.device.is_empty() {
        cv.line((x, y + 3), (x + 16, y + 3), POOL, true);
        sample(cv, y, "pool reserved");
        y += 14;
        cv.dashed((x - 4, y + 3), (x + 16, y + 3), POOL, true);
        let above = match t.device.pool_limit.last() {
            Some(p) if !l.on_scale(p.1) => format!(", {} above", bytes(p.1)),
            _ => String::new(),
        };
        sample(cv, y, &fit(format!("pool limit{above}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_timeline::tests::logged;
    use crate::memory_timeline::{DeviceTimeline, MemberTimeline};
    use crate::metrics::MetricRecord;

    const MIB: u64 = 1 << 20;

    /// A logged record with no reserve (see [`logged`]).
    fn record(time: f64, batch: usize, live: u64, peak: u64, limit: Option<u64>) -> MetricRecord {
        logged(time, batch, live, peak, None, limit)
    }

    /// Member `a`: 1 MiB live, 1.5 MiB reserved, a 3 MiB limit, an OOM (and its batch change) at 5 s; member `b`:
    /// 0.5 MiB, no limit; the pool: 2 MiB reserved under a 3.5 MiB limit.
    fn timeline() -> Timeline {
        let mut a: Vec<MetricRecord> = (0..=10)
            .map(|s| {
                record(
                    s as f64,
                    if s > 5 { 54 } else { 64 },
                    MIB,
                    MIB * 3 / 2,
                    Some(3 * MIB),
                )
            })
            .collect();
        a.insert(
            6,
            MetricRecord {
                event: Some("out of memory at step 50 with batch 64 on cpu; batch 64 -> 54".into()),
                mem_peak_bytes: None,
                mem_limit_bytes: None,
                ..record(5.0, 54, MIB, MIB, None)
            },
        );
        let b: Vec<MetricRecord> = (0..=10)
            .map(|s| record(s as f64, 32, MIB / 2, MIB / 2, None))
            .collect();
        Timeline {
            members: vec![
                MemberTimeline::from_records("a", &a, None),
                MemberTimeline::from_records("b", &b, None),
            ],
            device: DeviceTimeline {
                pool_reserved: (0..=10).map(|s| (s as f64, 2 * MIB)).collect(),
                pool_limit: (0..=10).map(|s| (s as f64, 7 * MIB / 2)).collect(),
                ..DeviceTimeline::default()
            },
        }
    }

    /// The PNG at `path`, decoded: its width and RGB pixels.
    fn decode(path: &Path) -> (usize, Vec<u8>) {
        let f = std::io::BufReader::new(std::fs::File::open(path).unwrap());
        let mut reader = png::Decoder::new(f).read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        (info.width as usize, buf)
    }

    #[test]
    fn the_layout_fits_every_line_and_leaves_out_a_limit_far_above() {
        let t = timeline();
        let l = layout(&t);
        assert_eq!((l.unit, l.unit_name), (MIB, "MiB"));
        assert_eq!(l.frame.x, (0.0, 10.0));
        assert!(l.on_scale(7 * MIB / 2) && l.frame.y.1 < 4.0, "{l:?}");
        let mut far = t.clone();
        far.members[0].limits[0].bytes = 1 << 30;
        let l = layout(&far);
        assert!(
            !l.on_scale(1 << 30),
            "a 1 GiB limit over 2 MiB of use is named, not drawn"
        );
        assert!(l.on_scale(7 * MIB / 2));
    }

    #[test]
    fn marks_sit_on_the_limit_run_into_or_on_the_live_line() {
        let mut t = timeline();
        let l = layout(&t);
        let kinds = |m: &[Mark]| {
            m.iter()
                .map(|m| (m.member, m.kind, m.time, m.bytes))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            kinds(&marks(&t, &l)),
            [
                (0, MarkKind::Batch { to: 54 }, 5.0, MIB),
                (0, MarkKind::OutOfMemory, 5.0, 3 * MIB),
            ]
        );
        // Without a limit (the device was full), an OOM sits on the live line, between its points.
        t.members[0].limits.clear();
        t.members[0].live = vec![(4.0, MIB), (6.0, 2 * MIB)];
        let m = marks(&t, &layout(&t));
        assert_eq!(m[1].bytes, MIB * 3 / 2);
        assert_eq!(value_at(&[], 1.0), None);
        assert_eq!(value_at(&[(1.0, 7)], 0.0), Some(7));
    }

    #[test]
    fn memory_png_draws_live_reserved_limits_ooms_and_the_pool() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("memory.png");
        let t = timeline();
        plot(&path, &t).unwrap();
        let (w, px) = decode(&path);
        assert_eq!(w, W);
        let l = layout(&t);
        let at = |(x, y): (i64, i64)| {
            let i = (y as usize * w + x as usize) * 3;
            [px[i], px[i + 1], px[i + 2]]
        };
        let (a, b) = (PALETTE[0], PALETTE[1]);
        // A dashed line of `c` along row `y` of the plot: drawn in places, left out in others.
        let dashed_row = |y: i64, c: [u8; 3]| {
            let n = (l.frame.left..l.frame.right)
                .filter(|&x| at((x, y)) == c)
                .count();
            let width = (l.frame.right - l.frame.left) as usize;
            n * 10 > width * 3 && n * 10 < width * 9
        };
        let (_, limit_y) = l.px(0.0, 3 * MIB);
        assert!(
            dashed_row(limit_y, a),
            "a's 3 MiB limit, dashed in its colour"
        );
        let (_, pool_y) = l.px(0.0, 7 * MIB / 2);
        assert!(dashed_row(pool_y, POOL), "the pool's limit");
        assert_eq!(at(l.px(2.5, 2 * MIB)), POOL, "the pool's reserved bytes");
        assert_eq!(
            at(l.px(7.5, MIB * 3 / 2)),
            lighter(a, RESERVED_SHADE),
            "a's reserved line"
        );
        assert_eq!(at(l.px(7.5, MIB)), a, "a's live line");
        assert_eq!(at(l.px(7.5, MIB / 2)), b, "b's live line");
        // a's OOM at 5 s: an × in a's colour, its four arms there; none where nothing happened (2.5 s).
        let arms = |(x, y): (i64, i64)| {
            [(-2, -2), (2, 2), (-2, 2), (2, -2)]
                .iter()
                .all(|(dx, dy)| at((x + dx, y + dy)) == a)
        };
        assert!(
            arms(l.px(5.0, 3 * MIB)),
            "an × at a's OOM, on the limit it ran into"
        );
        assert!(!arms(l.px(2.5, 3 * MIB)), "no × without an OOM");
        // The legend, right of the plot: both members' colours.
        for c in [a, b] {
            let found = (l.frame.top..l.frame.top + 80)
                .any(|y| (l.frame.right + 16..l.frame.right + 40).any(|x| at((x, y)) == c));
            assert!(found, "{c:?} in the legend");
        }
    }
}
