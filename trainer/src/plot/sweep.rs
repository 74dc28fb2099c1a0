//! `report.png`: a sweep's trials, one panel per searched dimension, the metric (y, one range for every panel, so
//! that panels compare) against the hyper-parameter's value (x: logarithmic for the log-uniform forms, evenly
//! spaced categories for choices, grids and strings), one marker per trial coloured by how it ended, the best
//! trial ringed, a legend above the panels. What `cohort report RUN` draws.

use std::path::Path;

use serde_json::Value;

use super::canvas::{BLACK, Canvas, Frame, GRID, H, PALETTE, W, tick_label, ticks};
use crate::error::Result;
use crate::leaderboard::{best_trial, compact};
use crate::report::{MemberSummary, Status, Summary};

/// The plot's file in a run directory.
pub const REPORT_PLOT_FILE: &str = "report.png";

const COMPLETED: [u8; 3] = PALETTE[0];
const PRUNED: [u8; 3] = PALETTE[7];
const FAILED: [u8; 3] = PALETTE[3];
const BEST: [u8; 3] = PALETTE[1];

/// Where the panels begin, under the title and the legend.
const PANELS_TOP: i64 = 56;
/// A panel's margins inside its cell: room for the y tick labels on the left, the x tick labels and the
/// dimension's name below.
const PANEL_LEFT: i64 = 54;
const PANEL_RIGHT: i64 = 14;
const PANEL_TOP: i64 = 8;
const PANEL_BOTTOM: i64 = 34;
/// A marker's radius, the best trial's and its ring's.
const MARKER: i64 = 4;
const BEST_MARKER: i64 = 6;
const BEST_RING: i64 = 8;

/// How a panel's x axis places values.
#[derive(Debug, Clone, PartialEq)]
enum Scale {
    /// At their value.
    Linear,
    /// At their logarithm (base 10): a frame's x range is in decades.
    Log,
    /// Evenly spaced, in this order, each at its index.
    Categories(Vec<String>),
}

/// One dimension's panel.
#[derive(Debug, Clone)]
struct Panel {
    /// The dimension's name.
    name: String,
    scale: Scale,
    frame: Frame,
    /// Each member's value of the dimension, in the summary's order.
    values: Vec<Option<Value>>,
}

impl Panel {
    /// Where `v` lies on the x axis, in the frame's units; `None` where the axis cannot show it (a value that is
    /// not positive on a log axis, one that is not a number on a numeric one).
    fn x(&self, v: &Value) -> Option<f64> {
        match &self.scale {
            Scale::Linear => v.as_f64(),
            Scale::Log => v.as_f64().filter(|x| *x > 0.0).map(f64::log10),
            Scale::Categories(c) => {
                let l = compact(v, false);
                c.iter().position(|x| *x == l).map(|i| i as f64)
            }
        }
    }
}

/// The scale for a dimension of `kind` whose drawn trials have `values`: log for the log-uniform forms (all
/// values positive), categories for choices, grids and anything that is not a number, linear otherwise.
fn scale(kind: &str, values: &[&Value]) -> Scale {
    let numbers: Option<Vec<f64>> = values.iter().map(|v| v.as_f64()).collect();
    match numbers {
        Some(xs) if !matches!(kind, "choice" | "grid") => {
            if kind.starts_with("loguniform") && xs.iter().all(|x| *x > 0.0) {
                Scale::Log
            } else {
                Scale::Linear
            }
        }
        numbers => {
            let mut c: Vec<(f64, String)> = values
                .iter()
                .map(|v| (v.as_f64().unwrap_or(0.0), compact(v, false)))
                .collect();
            if numbers.is_some() {
                c.sort_by(|a, b| a.0.total_cmp(&b.0));
            } else {
                c.sort_by(|a, b| a.1.cmp(&b.1));
            }
            let mut labels: Vec<String> = c.into_iter().map(|(_, l)| l).collect();
            labels.dedup();
            Scale::Categories(labels)
        }
    }
}

/// `(lo, hi)` widened by `share` of its span on each side; a single value by `flat` on each side.
fn padded((lo, hi): (f64, f64), share: f64, flat: f64) -> (f64, f64) {
    if hi > lo {
        let pad = (hi - lo) * share;
        (lo - pad, hi + pad)
    } else {
        (lo - flat, hi + flat)
    }
}

fn range(xs: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    xs.fold(None, |r, x| match r {
        None => Some((x, x)),
        Some((lo, hi)) => Some((lo.min(x), hi.max(x))),
    })
}

/// A member's metric where it is drawn: a finite one (failed trials without one are left out).
fn drawn(m: &MemberSummary) -> Option<f64> {
    m.best_metric.filter(|v| v.is_finite())
}

/// The panels of `summary`: one per sweep dimension (per hyper-parameter where the summary lists none; one of the
/// trial's number where there are none either), laid out in a grid under the legend, all with one y range.
fn layout(summary: &Summary) -> Vec<Panel> {
    let members = &summary.members;
    let mut dims: Vec<(String, String)> = summary
        .sweep
        .iter()
        .flat_map(|s| &s.dimensions)
        .map(|d| (d.name.clone(), d.kind.clone()))
        .collect();
    if dims.is_empty() {
        for m in members {
            for k in m.hyperparameters.keys() {
                if !dims.iter().any(|(n, _)| n == k) {
                    dims.push((k.clone(), String::new()));
                }
            }
        }
    }
    let columns: Vec<(String, String, Vec<Option<Value>>)> = if dims.is_empty() {
        let trials = members
            .iter()
            .enumerate()
            .map(|(i, m)| Some(Value::from(m.trial.unwrap_or(i))))
            .collect();
        vec![("trial".into(), "int".into(), trials)]
    } else {
        dims.into_iter()
            .map(|(name, kind)| {
                let values = members
                    .iter()
                    .map(|m| m.hyperparameters.get(&name).cloned())
                    .collect();
                (name, kind, values)
            })
            .collect()
    };
    let y = range(members.iter().filter_map(drawn)).unwrap_or((0.0, 1.0));
    let y = padded(y, 0.08, (y.0.abs() * 0.05).max(0.01));
    let n = columns.len();
    let cols = match n {
        0..=3 => n.max(1),
        4 => 2,
        5..=9 => 3,
        _ => 4,
    };
    let rows = n.div_ceil(cols).max(1);
    let (cell_w, cell_h) = (
        W as i64 / cols as i64,
        (H as i64 - PANELS_TOP) / rows as i64,
    );
    columns
        .into_iter()
        .enumerate()
        .map(|(i, (name, kind, values))| {
            let shown: Vec<&Value> = members
                .iter()
                .zip(&values)
                .filter(|(m, _)| drawn(m).is_some())
                .filter_map(|(_, v)| v.as_ref())
                .collect();
            let scale = scale(&kind, &shown);
            let x = match &scale {
                Scale::Categories(c) => (-0.5, c.len().max(1) as f64 - 0.5),
                Scale::Log => {
                    let r = range(shown.iter().filter_map(|v| v.as_f64()).map(f64::log10));
                    padded(r.unwrap_or((0.0, 1.0)), 0.08, 0.5)
                }
                Scale::Linear => {
                    let r = range(shown.iter().filter_map(|v| v.as_f64())).unwrap_or((0.0, 1.0));
                    padded(r, 0.08, r.0.abs().max(1.0) * 0.1)
                }
            };
            let (cx, cy) = (
                (i % cols) as i64 * cell_w,
                PANELS_TOP + (i / cols) as i64 * cell_h,
            );
            Panel {
                name,
                scale,
                frame: Frame {
                    left: cx + PANEL_LEFT,
                    top: cy + PANEL_TOP,
                    right: cx + cell_w - PANEL_RIGHT,
                    bottom: cy + cell_h - PANEL_BOTTOM,
                    x,
                    y,
                },
                values,
            }
        })
        .collect()
}

/// Ticks of a log axis over `lo..hi` decades, as (position in decades, label): the decades, or 1-2-5 within them
/// where fewer than two decades fall inside, or plain nice ticks on a range narrower than that.
fn log_ticks(lo: f64, hi: f64) -> Vec<(f64, String)> {
    let mut all = Vec::new();
    for d in lo.floor() as i32..=hi.ceil() as i32 {
        for m in [1, 2, 5] {
            let t = (f64::from(m) * 10f64.powi(d)).log10();
            if (lo..=hi).contains(&t) {
                all.push((t, m, d));
            }
        }
    }
    let decades: Vec<_> = all.iter().filter(|t| t.1 == 1).copied().collect();
    let chosen = if decades.len() >= 2 {
        decades
    } else if all.len() >= 2 {
        all
    } else {
        return ticks(10f64.powf(lo), 10f64.powf(hi), 3)
            .into_iter()
            .filter(|v| *v > 0.0)
            .map(|v| (v.log10(), tick_label(v)))
            .collect();
    };
    // One form along an axis: powers of ten where any tick needs one.
    let sci = chosen.iter().any(|&(_, _, d)| !(-2..5).contains(&d));
    chosen
        .into_iter()
        .map(|(t, m, d)| {
            let label = if sci {
                format!("{m}e{d}")
            } else {
                tick_label(f64::from(m) * 10f64.powi(d))
            };
            (t, label)
        })
        .collect()
}

/// A panel's grid, tick labels, axes and the dimension's name under it.
fn draw_axes(cv: &mut Canvas, p: &Panel) {
    let f = &p.frame;
    for t in ticks(f.y.0, f.y.1, 5) {
        let (_, py) = f.px(f.x.0, t);
        cv.line((f.left, py), (f.right, py), GRID, false);
        let l = tick_label(t);
        cv.text(f.left - 6 - Canvas::text_width(&l, 1), py - 3, &l, 1, BLACK);
    }
    let xs: Vec<(f64, String)> = match &p.scale {
        Scale::Linear => ticks(f.x.0, f.x.1, 4)
            .into_iter()
            .map(|t| (t, tick_label(t)))
            .collect(),
        Scale::Log => log_ticks(f.x.0, f.x.1),
        Scale::Categories(c) => {
            let room = ((f.right - f.left) / c.len().max(1) as i64 / 6 - 1).max(1) as usize;
            c.iter()
                .enumerate()
                .map(|(i, l)| (i as f64, l.chars().take(room).collect()))
                .collect()
        }
    };
    for (t, l) in xs {
        let (px, _) = f.px(t, f.y.0);
        cv.line((px, f.top), (px, f.bottom), GRID, false);
        cv.text(
            px - Canvas::text_width(&l, 1) / 2,
            f.bottom + 6,
            &l,
            1,
            BLACK,
        );
    }
    cv.line((f.left, f.bottom), (f.right, f.bottom), BLACK, false);
    cv.line((f.left, f.bottom), (f.left, f.top), BLACK, false);
    let name = match p.scale {
        Scale::Log => format!("{} (log)", p.name),
        _ => p.name.clone(),
    };
    let mid = (f.left + f.right) / 2;
    cv.text(
        mid - Canvas::text_width(&name, 1) / 2,
        f.bottom + 19,
        &name,
        1,
        BLACK,
    );
}

/// Offsets along x that set the trials `shown` of one category side by side instead of on top of each other, in
/// trial order (spread by status, they would read as a trend); none on a numeric axis.
fn spread(p: &Panel, shown: &[usize]) -> Vec<f64> {
    let mut out = vec![0.0; p.values.len()];
    let Scale::Categories(c) = &p.scale else {
        return out;
    };
    let at = |i: usize| {
        p.values[i]
            .as_ref()
            .and_then(|v| p.x(v))
            .map(|k| k as usize)
    };
    let mut count = vec![0usize; c.len()];
    for k in shown.iter().filter_map(|&i| at(i)) {
        count[k] += 1;
    }
    let mut seen = vec![0usize; c.len()];
    for &i in shown {
        if let Some(k) = at(i) {
            if count[k] > 1 {
                out[i] = ((seen[k] as f64 + 0.5) / count[k] as f64 - 0.5) * 0.6;
            }
            seen[k] += 1;
        }
    }
    out
}

/// Pixels within `r` of `c` (and more than `inner` from it: a ring).
fn disc(cv: &mut Canvas, (x, y): (i64, i64), inner: f64, r: i64, c: [u8; 3]) {
    let outer = r as f64 + 0.5;
    for dy in -r..=r {
        for dx in -r..=r {
            let d = ((dx * dx + dy * dy) as f64).sqrt();
            if d > inner && d <= outer {
                cv.set(x + dx, y + dy, c);
            }
        }
    }
}

/// A trial's marker: a dot in its status's colour, an × for a failed one; the best a larger dot, ringed.
fn marker(cv: &mut Canvas, p: (i64, i64), status: Status, best: bool) {
    if best {
        disc(cv, p, BEST_RING as f64 - 2.0, BEST_RING, BLACK);
        disc(cv, p, -1.0, BEST_MARKER, BEST);
    } else if status == Status::Failed {
        cv.cross(p, MARKER, FAILED);
    } else {
        let c = if status == Status::Pruned {
            PRUNED
        } else {
            COMPLETED
        };
        disc(cv, p, -1.0, MARKER, c);
    }
}

/// Draws `summary`'s sweep into `path` (PNG, 960×540): see the module's documentation. A summary without a sweep
/// gets a panel per hyper-parameter its members have, ranked by their best metric.
///
/// # Errors
/// [`crate::Error::Plot`] or an I/O error when the file cannot be written.
pub fn write_report_plot(path: &Path, summary: &Summary) -> Result<()> {
    let panels = layout(summary);
    let metric = summary
        .sweep
        .as_ref()
        .map_or("best metric", |s| s.metric.as_str());
    let mode = summary.sweep.as_ref().map_or("max", |s| s.mode.as_str());
    let best = best_trial(summary).map(|m| m.name.as_str());
    let mut cv = Canvas::new();
    let n = summary.members.len();
    let title = format!("{metric} by hyper-parameter, {n} trials ({mode} is best)");
    cv.text(
        W as i64 / 2 - Canvas::text_width(&title, 2) / 2,
        10,
        &title,
        2,
        BLACK,
    );
    let shown: Vec<usize> = (0..n)
        .filter(|&i| drawn(&summary.members[i]).is_some())
        .collect();
    // Pruned trials first and the best last, so that the ones a reader looks for lie on top.
    let mut order = shown.clone();
    order.sort_by_key(|&i| {
        let m = &summary.members[i];
        match (best == Some(m.name.as_str()), m.status) {
            (true, _) => 3,
            (false, Status::Pruned) => 0,
            (false, Status::Completed) => 1,
            (false, Status::Failed) => 2,
        }
    });
    for p in &panels {
        draw_axes(&mut cv, p);
        let offsets = spread(p, &shown);
        for &i in &order {
            let m = &summary.members[i];
            let (Some(x), Some(y)) = (p.values[i].as_ref().and_then(|v| p.x(v)), drawn(m)) else {
                continue;
            };
            let is_best = best == Some(m.name.as_str());
            marker(&mut cv, p.frame.px(x + offsets[i], y), m.status, is_best);
        }
    }
    if order.is_empty()
        && let Some(p) = panels.first()
    {
        let note = format!("no trial reported {metric}");
        let f = &p.frame;
        let mid = ((f.left + f.right) / 2, (f.top + f.bottom) / 2);
        cv.text(
            mid.0 - Canvas::text_width(&note, 1) / 2,
            mid.1,
            &note,
            1,
            BLACK,
        );
    }
    legend(&mut cv, summary, best);
    cv.write_png(path)
}

/// The legend, a row under the title: each status with its count, and the best trial.
fn legend(cv: &mut Canvas, summary: &Summary, best: Option<&str>) {
    let ms = &summary.members;
    let count = |s: Status| ms.iter().filter(|m| m.status == s).count();
    let unscored = ms
        .iter()
        .filter(|m| m.status == Status::Failed && drawn(m).is_none())
        .count();
    let failed = match unscored {
        0 => format!("failed ({})", count(Status::Failed)),
        k => format!(
            "failed ({}, {k} not drawn: no score)",
            count(Status::Failed)
        ),
    };
    let items = [
        (
            Some(Status::Completed),
            format!("completed ({})", count(Status::Completed)),
        ),
        (
            Some(Status::Pruned),
            format!("pruned ({})", count(Status::Pruned)),
        ),
        (Some(Status::Failed), failed),
        (
            None,
            best.map_or("no best trial".into(), |b| format!("best: {b}")),
        ),
    ];
    let (mut x, y) = (PANEL_LEFT, 38);
    for (status, label) in items {
        match status {
            Some(s) => marker(cv, (x + 6, y + 3), s, false),
            None => marker(cv, (x + 6, y + 3), Status::Completed, true),
        }
        cv.text(x + 18, y, &label, 1, BLACK);
        x += 18 + Canvas::text_width(&label, 1) + 24;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::leaderboard::tests::{member, sweep};

    /// lr (log-uniform) from 1e-4 to 1e-2 and an activation (a choice of strings): `t-2` is best at lr 1e-3; `t-4`
    /// failed without a score.
    fn summary() -> Summary {
        let hp = |lr: f64, act: &str| vec![("lr", json!(lr)), ("act", json!(act))];
        sweep(
            vec![
                member("t-1", Status::Completed, Some(0.90), &hp(1e-4, "relu")),
                member("t-2", Status::Completed, Some(0.97), &hp(1e-3, "gelu")),
                member("t-3", Status::Pruned, Some(0.93), &hp(1e-2, "tanh")),
                member("t-4", Status::Failed, None, &hp(5e-1, "relu")),
            ],
            "val_accuracy",
            "max",
            &[("lr", "loguniform"), ("act", "choice")],
            Some("t-2"),
        )
    }

    fn decode(path: &Path) -> image::RgbImage {
        image::open(path).unwrap().to_rgb8()
    }

    fn at(img: &image::RgbImage, (x, y): (i64, i64)) -> [u8; 3] {
        img.get_pixel(x as u32, y as u32).0
    }

    #[test]
    fn each_kind_gets_its_axis() {
        let (a, b, c) = (json!(1e-3), json!(1e-2), json!("relu"));
        assert_eq!(scale("loguniform", &[&a, &b]), Scale::Log);
        assert_eq!(
            scale("loguniform-int", &[&json!(16), &json!(1024)]),
            Scale::Log
        );
        assert_eq!(scale("loguniform", &[&json!(0.0), &b]), Scale::Linear);
        assert_eq!(scale("uniform", &[&a, &b]), Scale::Linear);
        assert_eq!(
            scale("choice", &[&json!(256), &json!(64), &json!(256)]),
            Scale::Categories(vec!["64".into(), "256".into()])
        );
        assert_eq!(
            scale("int", &[&c, &json!("gelu")]),
            Scale::Categories(vec!["gelu".into(), "relu".into()])
        );
        let t = log_ticks(-4.2, -1.8);
        let labels: Vec<&str> = t.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["1e-4", "1e-3", "1e-2"]);
        assert!((t[1].0 + 3.0).abs() < 1e-12);
        let labels: Vec<String> = log_ticks(1.1, 2.6).into_iter().map(|(_, l)| l).collect();
        assert_eq!(labels, ["20", "50", "100", "200"]);
    }

    #[test]
    fn report_png_puts_the_best_trial_where_its_log_axis_says() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(REPORT_PLOT_FILE);
        let s = summary();
        write_report_plot(&path, &s).unwrap();
        let img = decode(&path);
        assert_eq!(img.dimensions(), (W as u32, H as u32));
        let panels = layout(&s);
        assert_eq!(panels.len(), 2);
        let (lr, act) = (&panels[0], &panels[1]);
        assert_eq!(lr.scale, Scale::Log);
        // 1e-3 halfway between 1e-4 and 1e-2 on a log axis (a linear one would put it near the left edge).
        let best = lr.frame.px(-3.0, 0.97);
        let mid = (lr.frame.left + lr.frame.right) / 2;
        assert!((best.0 - mid).abs() <= 1, "{best:?} vs {mid}");
        assert_eq!(at(&img, best), BEST, "the best trial's dot");
        assert_eq!(
            at(&img, (best.0 + BEST_RING - 1, best.1)),
            BLACK,
            "its ring"
        );
        assert_eq!(at(&img, lr.frame.px(-4.0, 0.90)), COMPLETED, "t-1 at 1e-4");
        assert_eq!(
            at(&img, lr.frame.px(-2.0, 0.93)),
            PRUNED,
            "t-3 at 1e-2, pruned"
        );
        let linear = lr.frame.px((1e-3 - 1e-4) / (1e-2 - 1e-4) * 2.0 - 4.0, 0.97);
        assert_ne!(
            at(&img, linear),
            BEST,
            "nothing where a linear axis would put it"
        );
        // Categories sorted and evenly spaced: gelu, relu, tanh.
        assert_eq!(
            act.scale,
            Scale::Categories(vec!["gelu".into(), "relu".into(), "tanh".into()])
        );
        assert_eq!(at(&img, act.frame.px(0.0, 0.97)), BEST, "t-2, gelu");
        assert_eq!(at(&img, act.frame.px(1.0, 0.90)), COMPLETED, "t-1, relu");
        assert_eq!(at(&img, act.frame.px(2.0, 0.93)), PRUNED, "t-3, tanh");
    }

    #[test]
    fn failed_trials_without_a_metric_are_not_drawn_and_scored_ones_are() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(REPORT_PLOT_FILE);
        let red = |s: &Summary| {
            write_report_plot(&path, s).unwrap();
            let img = decode(&path);
            layout(s)
                .iter()
                .map(|p| {
                    let f = p.frame;
                    (f.top..=f.bottom)
                        .flat_map(|y| (f.left..=f.right).map(move |x| (x, y)))
                        .filter(|&p| at(&img, p) == FAILED)
                        .count()
                })
                .sum::<usize>()
        };
        let mut s = summary();
        assert_eq!(red(&s), 0, "t-4 failed without a score: not drawn");
        s.members[3].best_metric = Some(0.91);
        assert!(red(&s) > 0, "t-4 with a score: an × in each panel");
        // No trial scored: the panels and a note, no markers.
        s.members.iter_mut().for_each(|m| m.best_metric = None);
        assert_eq!(red(&s), 0);
    }
}
