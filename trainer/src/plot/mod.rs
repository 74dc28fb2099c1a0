//! PNG plots of a run: `loss.png` (training loss by step) and `memory.png` (each member's live and reserved
//! memory, its limit, its out-of-memory events and batch changes over time; on a GPU the pool and its limit).
//!
//! A deliberately small rasterizer (`canvas`): axes, ticks with labels in a built-in 5×7 font, coloured solid and
//! dashed polylines, markers and a legend. No font files, no system libraries.

use std::path::Path;

use crate::error::Result;
use crate::memory_timeline::Timeline;
use crate::metrics::MetricRecord;

mod canvas;
pub mod memory;
pub mod sweep;

use canvas::{BLACK, Canvas, H, PALETTE, W};
pub use canvas::{Frame, PlotSpec};

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Series {
    /// Its legend label.
    pub name: String,
    /// Points `(x, y)`, in x order.
    pub points: Vec<(f64, f64)>,
}

const LEFT: i64 = 80;
const RIGHT: i64 = 24;
const TOP: i64 = 40;
const BOTTOM: i64 = 56;

/// Draws `series` as a line plot into `path` (PNG, 960×540).
///
/// # Errors
/// [`crate::Error::Plot`] when the file cannot be written.
pub fn line_plot(path: &Path, spec: &PlotSpec<'_>, series: &[Series]) -> Result<()> {
    let mut cv = Canvas::new();
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts.filter(|(x, y)| x.is_finite() && y.is_finite()) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    y0 = y0.min(0.0);
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    y1 += (y1 - y0) * 0.05;
    let frame = Frame {
        left: LEFT,
        top: TOP,
        right: W as i64 - RIGHT,
        bottom: H as i64 - BOTTOM,
        x: (x0, x1),
        y: (y0, y1),
    };
    frame.draw_axes(&mut cv, spec);
    let lw = series
        .iter()
        .map(|s| Canvas::text_width(&s.name, 1))
        .max()
        .unwrap_or(0);
    for (i, s) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let points: Vec<(i64, i64)> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| frame.px(x, y))
            .collect();
        cv.polyline(&points, c);
        let lx = frame.right - lw - 30;
        let ly = TOP + 8 + i as i64 * 14;
        cv.rect(lx, ly, 16, 7, c);
        cv.text(lx + 22, ly, &s.name, 1, BLACK);
    }
    cv.write_png(path)
}

/// Writes `loss.png` (training loss by step, from each member's `records`) and `memory.png` ([`memory::plot`] of
/// the run's `timeline`).
///
/// # Errors
/// I/O errors writing the images.
pub fn write_run_plots(
    root: &Path,
    members: &[String],
    records: &[Vec<MetricRecord>],
    timeline: &Timeline,
) -> Result<()> {
    let loss: Vec<Series> = members
        .iter()
        .zip(records)
        .map(|(name, records)| Series {
            name: name.clone(),
            points: records
                .iter()
                .filter(|r| r.event.is_none())
                .map(|r| (r.step as f64, r.loss))
                .collect(),
        })
        .collect();
    line_plot(
        &root.join("loss.png"),
        &PlotSpec {
            title: "training loss",
            x_label: "step",
            y_label: "loss",
        },
        &loss,
    )?;
    memory::plot(&root.join(crate::run_dir::MEMORY_PLOT_FILE), timeline)
}

#[cfg(test)]
mod tests {
    use super::canvas::{tick_label, ticks};
    use super::*;

    #[test]
    fn nice_ticks() {
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(tick_label(1500.0), "1500");
    }

    #[test]
    fn writes_a_png() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("loss.png");
        let s = vec![Series {
            name: "mlp-lr1e-3".into(),
            points: (0..50)
                .map(|i| (i as f64, 2.3 / (1.0 + i as f64)))
                .collect(),
        }];
        line_plot(
            &p,
            &PlotSpec {
                title: "loss",
                x_label: "step",
                y_label: "loss",
            },
            &s,
        )
        .unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }
}
