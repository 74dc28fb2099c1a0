//! PNG line plots (loss curves, memory by member over time), drawn into an RGB buffer and encoded with `png`.
//!
//! A deliberately small rasterizer: axes, ticks with labels in a built-in 5×7 font, one coloured polyline per
//! series and a legend. No font files, no system libraries.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use crate::error::{Error, Result};

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Series {
    /// Its legend label.
    pub name: String,
    /// Points `(x, y)`, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A plot's labels.
#[derive(Debug, Clone)]
pub struct PlotSpec<'a> {
    /// The title.
    pub title: &'a str,
    /// The x-axis label.
    pub x_label: &'a str,
    /// The y-axis label.
    pub y_label: &'a str,
}

const W: usize = 960;
const H: usize = 540;
const LEFT: usize = 80;
const RIGHT: usize = 24;
const TOP: usize = 40;
const BOTTOM: usize = 56;

/// Matplotlib's tab10 palette.
const PALETTE: [[u8; 3]; 10] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
];

/// 5×7 glyphs, one byte per row, the low 5 bits from left (bit 4) to right (bit 0). Lowercase letters are drawn as
/// capitals.
fn glyph(c: char) -> [u8; 7] {
    let rows: [&str; 7] = match c.to_ascii_uppercase() {
        '0' => [
            "01110", "10001", "10011", "10101", "11001", "10001", "01110",
        ],
        '1' => [
            "00100", "01100", "00100", "00100", "00100", "00100", "01110",
        ],
        '2' => [
            "01110", "10001", "00001", "00010", "00100", "01000", "11111",
        ],
        '3' => [
            "11111", "00010", "00100", "00010", "00001", "10001", "01110",
        ],
        '4' => [
            "00010", "00110", "01010", "10010", "11111", "00010", "00010",
        ],
        '5' => [
            "11111", "10000", "11110", "00001", "00001", "10001", "01110",
        ],
        '6' => [
            "00110", "01000", "10000", "11110", "10001", "10001", "01110",
        ],
        '7' => [
            "11111", "00001", "00010", "00100", "01000", "01000", "01000",
        ],
        '8' => [
            "01110", "10001", "10001", "01110", "10001", "10001", "01110",
        ],
        '9' => [
            "01110", "10001", "10001", "01111", "00001", "00010", "01100",
        ],
        'A' => [
            "01110", "10001", "10001", "11111", "10001", "10001", "10001",
        ],
        'B' => [
            "11110", "10001", "10001", "11110", "10001", "10001", "11110",
        ],
        'C' => [
            "01110", "10001", "10000", "10000", "10000", "10001", "01110",
        ],
        'D' => [
            "11100", "10010", "10001", "10001", "10001", "10010", "11100",
        ],
        'E' => [
            "11111", "10000", "10000", "11110", "10000", "10000", "11111",
        ],
        'F' => [
            "11111", "10000", "10000", "11110", "10000", "10000", "10000",
        ],
        'G' => [
            "01110", "10001", "10000", "10111", "10001", "10001", "01111",
        ],
        'H' => [
            "10001", "10001", "10001", "11111", "10001", "10001", "10001",
        ],
        'I' => [
            "01110", "00100", "00100", "00100", "00100", "00100", "01110",
        ],
        'J' => [
            "00111", "00010", "00010", "00010", "00010", "10010", "01100",
        ],
        'K' => [
            "10001", "10010", "10100", "11000", "10100", "10010", "10001",
        ],
        'L' => [
            "10000", "10000", "10000", "10000", "10000", "10000", "11111",
        ],
        'M' => [
            "10001", "11011", "10101", "10101", "10001", "10001", "10001",
        ],
        'N' => [
            "10001", "10001", "11001", "10101", "10011", "10001", "10001",
        ],
        'O' => [
            "01110", "10001", "10001", "10001", "10001", "10001", "01110",
        ],
        'P' => [
            "11110", "10001", "10001", "11110", "10000", "10000", "10000",
        ],
        'Q' => [
            "01110", "10001", "10001", "10001", "10101", "10010", "01101",
        ],
        'R' => [
            "11110", "10001", "10001", "11110", "10100", "10010", "10001",
        ],
        'S' => [
            "01111", "10000", "10000", "01110", "00001", "00001", "11110",
        ],
        'T' => [
            "11111", "00100", "00100", "00100", "00100", "00100", "00100",
        ],
        'U' => [
            "10001", "10001", "10001", "10001", "10001", "10001", "01110",
        ],
        'V' => [
            "10001", "10001", "10001", "10001", "10001", "01010", "00100",
        ],
        'W' => [
            "10001", "10001", "10001", "10101", "10101", "10101", "01010",
        ],
        'X' => [
            "10001", "10001", "01010", "00100", "01010", "10001", "10001",
        ],
        'Y' => [
            "10001", "10001", "10001", "01010", "00100", "00100", "00100",
        ],
        'Z' => [
            "11111", "00001", "00010", "00100", "01000", "10000", "11111",
        ],
        '.' => [
            "00000", "00000", "00000", "00000", "00000", "01100", "01100",
        ],
        '-' => [
            "00000", "00000", "00000", "11111", "00000", "00000", "00000",
        ],
        '+' => [
            "00000", "00100", "00100", "11111", "00100", "00100", "00000",
        ],
        ':' => [
            "00000", "01100", "01100", "00000", "01100", "01100", "00000",
        ],
        '%' => [
            "11000", "11001", "00010", "00100", "01000", "10011", "00011",
        ],
        '(' => [
            "00010", "00100", "01000", "01000", "01000", "00100", "00010",
        ],
        ')' => [
            "01000", "00100", "00010", "00010", "00010", "00100", "01000",
        ],
        '/' => [
            "00000", "00001", "00010", "00100", "01000", "10000", "00000",
        ],
        '_' => [
            "00000", "00000", "00000", "00000", "00000", "00000", "11111",
        ],
        ',' => [
            "00000", "00000", "00000", "00000", "01100", "00100", "01000",
        ],
        '=' => [
            "00000", "00000", "11111", "00000", "11111", "00000", "00000",
        ],
        _ => ["00000"; 7],
    };
    let mut g = [0u8; 7];
    for (i, r) in rows.iter().enumerate() {
        g[i] = u8::from_str_radix(r, 2).unwrap_or(0);
    }
    g
}

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            px: vec![255; W * H * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < W && (y as usize) < H {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    fn rect(&mut self, x0: i64, y0: i64, w: i64, h: i64, c: [u8; 3]) {
        for y in y0..y0 + h {
            for x in x0..x0 + w {
                self.set(x, y, c);
            }
        }
    }

    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3], thick: bool) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.set(x, y, c);
            if thick {
                self.set(x + 1, y, c);
                self.set(x, y + 1, c);
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Text with its top-left corner at (x, y), `scale` pixels per font dot.
    fn text(&mut self, x: i64, y: i64, s: &str, scale: i64, c: [u8; 3]) {
        for (i, ch) in s.chars().enumerate() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (1 << (4 - col)) != 0 {
                        self.rect(
                            x + (i as i64 * 6 + col) * scale,
                            y + row as i64 * scale,
                            scale,
                            scale,
                            c,
                        );
                    }
                }
            }
        }
    }

    fn text_width(s: &str, scale: i64) -> i64 {
        s.chars().count() as i64 * 6 * scale
    }
}

/// "Nice" tick positions covering [lo, hi].
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= n as f64)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

fn tick_label(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        format!("{v:.0e}")
    } else if v.fract() == 0.0 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Draws `series` as a line plot into `path` (PNG, 960×540).
///
/// # Errors
/// [`Error::Plot`] when the file cannot be written.
pub fn line_plot(path: &Path, spec: &PlotSpec<'_>, series: &[Series]) -> Result<()> {
    let mut cv = Canvas::new();
    let black = [0, 0, 0];
    let grey = [225, 225, 225];
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
    let (pw, ph) = ((W - LEFT - RIGHT) as f64, (H - TOP - BOTTOM) as f64);
    let to_px = |x: f64, y: f64| {
        (
            LEFT as i64 + ((x - x0) / (x1 - x0) * pw).round() as i64,
            (TOP as f64 + ph - (y - y0) / (y1 - y0) * ph).round() as i64,
        )
    };
    for t in ticks(y0, y1, 6) {
        let (_, py) = to_px(x0, t);
        cv.line((LEFT as i64, py), ((W - RIGHT) as i64, py), grey, false);
        let l = tick_label(t);
        cv.text(
            LEFT as i64 - 8 - Canvas::text_width(&l, 1),
            py - 3,
            &l,
            1,
            black,
        );
    }
    for t in ticks(x0, x1, 8) {
        let (px, _) = to_px(t, y0);
        cv.line((px, TOP as i64), (px, (H - BOTTOM) as i64), grey, false);
        let l = tick_label(t);
        cv.text(
            px - Canvas::text_width(&l, 1) / 2,
            (H - BOTTOM) as i64 + 8,
            &l,
            1,
            black,
        );
    }
    let (bl, br) = (
        (LEFT as i64, (H - BOTTOM) as i64),
        ((W - RIGHT) as i64, (H - BOTTOM) as i64),
    );
    cv.line(bl, br, black, false);
    cv.line(bl, (LEFT as i64, TOP as i64), black, false);
    cv.text(
        (W as i64 - Canvas::text_width(spec.title, 2)) / 2,
        12,
        spec.title,
        2,
        black,
    );
    cv.text(
        (W as i64 - Canvas::text_width(spec.x_label, 1)) / 2,
        H as i64 - 20,
        spec.x_label,
        1,
        black,
    );
    cv.text(8, TOP as i64 - 14, spec.y_label, 1, black);
    for (i, s) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let mut prev: Option<(i64, i64)> = None;
        for &(x, y) in s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
        {
            let p = to_px(x, y);
            if let Some(q) = prev {
                cv.line(q, p, c, true);
            } else {
                cv.rect(p.0 - 1, p.1 - 1, 3, 3, c);
            }
            prev = Some(p);
        }
        let lw = series
            .iter()
            .map(|s| Canvas::text_width(&s.name, 1))
            .max()
            .unwrap_or(0);
        let lx = (W - RIGHT) as i64 - lw - 30;
        let ly = TOP as i64 + 8 + i as i64 * 14;
        cv.rect(lx, ly, 16, 7, c);
        cv.text(lx + 22, ly, &s.name, 1, black);
    }
    let bad = |e: String| Error::Plot {
        path: path.to_path_buf(),
        message: e,
    };
    let f = File::create(path).map_err(|e| Error::io(path, e))?;
    let mut enc = png::Encoder::new(BufWriter::new(f), W as u32, H as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| bad(e.to_string()))?;
    w.write_image_data(&cv.px).map_err(|e| bad(e.to_string()))?;
    w.finish().map_err(|e| bad(e.to_string()))?;
    Ok(())
}

/// Writes `loss.png` (training loss by step) and `memory.png` (bytes held by member over time) of a run from its
/// members' `metrics.jsonl`.
///
/// # Errors
/// I/O errors reading the metrics or writing the images.
pub fn write_run_plots(root: &Path, members: &[String]) -> Result<()> {
    let mut loss = Vec::new();
    let mut mem = Vec::new();
    for name in members {
        let records = crate::metrics::read(&root.join(name).join("metrics.jsonl"))?;
        let train: Vec<_> = records.iter().filter(|r| r.event.is_none()).collect();
        loss.push(Series {
            name: name.clone(),
            points: train.iter().map(|r| (r.step as f64, r.loss)).collect(),
        });
        mem.push(Series {
            name: name.clone(),
            points: train
                .iter()
                .map(|r| (r.time, r.mem_bytes as f64 / (1024.0 * 1024.0)))
                .collect(),
        });
    }
    line_plot(
        &root.join("loss.png"),
        &PlotSpec {
            title: "training loss",
            x_label: "step",
            y_label: "loss",
        },
        &loss,
    )?;
    line_plot(
        &root.join("memory.png"),
        &PlotSpec {
            title: "memory by member",
            x_label: "time (s)",
            y_label: "MiB",
        },
        &mem,
    )
}

#[cfg(test)]
mod tests {
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
