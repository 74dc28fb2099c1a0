//! The rasterizer under the plots: an RGB canvas, lines (solid and dashed), markers, text in a built-in 5×7 font,
//! a plot frame with its axes, grid and tick labels, and PNG encoding. No font files, no system libraries.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use crate::error::{Error, Result};

/// An image's size: 960×540.
pub(super) const W: usize = 960;
pub(super) const H: usize = 540;

/// Matplotlib's tab10 palette.
pub(super) const PALETTE: [[u8; 3]; 10] = [
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

pub(super) const BLACK: [u8; 3] = [0, 0, 0];
pub(super) const GRID: [u8; 3] = [225, 225, 225];

/// `c` a `share` of the way to white: the lighter line of the same colour.
pub(super) fn lighter(c: [u8; 3], share: f64) -> [u8; 3] {
    c.map(|v| (f64::from(v) + (255.0 - f64::from(v)) * share).round() as u8)
}

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

/// An RGB image being drawn.
pub(super) struct Canvas {
    pub(super) px: Vec<u8>,
}

impl Canvas {
    pub(super) fn new() -> Canvas {
        Canvas {
            px: vec![255; W * H * 3],
        }
    }

    pub(super) fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < W && (y as usize) < H {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    pub(super) fn rect(&mut self, x0: i64, y0: i64, w: i64, h: i64, c: [u8; 3]) {
        for y in y0..y0 + h {
            for x in x0..x0 + w {
                self.set(x, y, c);
            }
        }
    }

    /// A line; `dash`: `(on, off)` pixels for a dashed one.
    fn stroke(
        &mut self,
        (x0, y0): (i64, i64),
        (x1, y1): (i64, i64),
        c: [u8; 3],
        thick: bool,
        dash: Option<(u32, u32)>,
    ) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        let mut n: u32 = 0;
        loop {
            if dash.is_none_or(|(on, off)| n % (on + off) < on) {
                self.set(x, y, c);
                if thick {
                    self.set(x + 1, y, c);
                    self.set(x, y + 1, c);
                }
            }
            n += 1;
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

    pub(super) fn line(&mut self, p: (i64, i64), q: (i64, i64), c: [u8; 3], thick: bool) {
        self.stroke(p, q, c, thick, None);
    }

    /// A dashed line, 8 pixels drawn, 5 left out.
    pub(super) fn dashed(&mut self, p: (i64, i64), q: (i64, i64), c: [u8; 3], thick: bool) {
        self.stroke(p, q, c, thick, Some((8, 5)));
    }

    /// A polyline through `points`; a single point is a dot.
    pub(super) fn polyline(&mut self, points: &[(i64, i64)], c: [u8; 3]) {
        if let [p] = points {
            self.rect(p.0 - 1, p.1 - 1, 3, 3, c);
        }
        for w in points.windows(2) {
            self.line(w[0], w[1], c, true);
        }
    }

    /// An ×, `r` pixels from its centre to each corner, three pixels wide.
    pub(super) fn cross(&mut self, (x, y): (i64, i64), r: i64, c: [u8; 3]) {
        for d in -1..=1 {
            self.line((x - r + d, y - r), (x + r + d, y + r), c, false);
            self.line((x - r + d, y + r), (x + r + d, y - r), c, false);
        }
    }

    /// A hollow square, `r` pixels from its centre to each side, two pixels wide.
    pub(super) fn square(&mut self, (x, y): (i64, i64), r: i64, c: [u8; 3]) {
        for k in [r, r - 1] {
            self.line((x - k, y - k), (x + k, y - k), c, false);
            self.line((x + k, y - k), (x + k, y + k), c, false);
            self.line((x + k, y + k), (x - k, y + k), c, false);
            self.line((x - k, y + k), (x - k, y - k), c, false);
        }
    }

    /// Text with its top-left corner at (x, y), `scale` pixels per font dot.
    pub(super) fn text(&mut self, x: i64, y: i64, s: &str, scale: i64, c: [u8; 3]) {
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

    pub(super) fn text_width(s: &str, scale: i64) -> i64 {
        s.chars().count() as i64 * 6 * scale
    }

    /// Encodes the image as a PNG into `path`.
    ///
    /// # Errors
    /// [`Error::Plot`] or an I/O error when the file cannot be written.
    pub(super) fn write_png(&self, path: &Path) -> Result<()> {
        let bad = |e: String| Error::Plot {
            path: path.to_path_buf(),
            message: e,
        };
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
        let mut enc = png::Encoder::new(BufWriter::new(f), W as u32, H as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(|e| bad(e.to_string()))?;
        w.write_image_data(&self.px)
            .map_err(|e| bad(e.to_string()))?;
        w.finish().map_err(|e| bad(e.to_string()))?;
        Ok(())
    }
}

/// "Nice" tick positions covering [lo, hi].
pub(super) fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
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

pub(super) fn tick_label(v: f64) -> String {
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

/// Where a plot's data lands: the plot area in pixels and the data range it shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Frame {
    /// The plot area's left edge, in pixels.
    pub left: i64,
    /// Its top edge.
    pub top: i64,
    /// Its right edge.
    pub right: i64,
    /// Its bottom edge (the x axis).
    pub bottom: i64,
    /// The x range shown.
    pub x: (f64, f64),
    /// The y range shown.
    pub y: (f64, f64),
}

impl Frame {
    /// The pixel of data point (x, y).
    pub fn px(&self, x: f64, y: f64) -> (i64, i64) {
        let (pw, ph) = (
            (self.right - self.left) as f64,
            (self.bottom - self.top) as f64,
        );
        (
            self.left + ((x - self.x.0) / (self.x.1 - self.x.0) * pw).round() as i64,
            (self.top as f64 + ph - (y - self.y.0) / (self.y.1 - self.y.0) * ph).round() as i64,
        )
    }

    /// Grid lines, tick labels, axes, the title and the axis labels.
    pub(super) fn draw_axes(&self, cv: &mut Canvas, spec: &PlotSpec<'_>) {
        for t in ticks(self.y.0, self.y.1, 6) {
            let (_, py) = self.px(self.x.0, t);
            cv.line((self.left, py), (self.right, py), GRID, false);
            let l = tick_label(t);
            cv.text(
                self.left - 8 - Canvas::text_width(&l, 1),
                py - 3,
                &l,
                1,
                BLACK,
            );
        }
        for t in ticks(self.x.0, self.x.1, 8) {
            let (px, _) = self.px(t, self.y.0);
            cv.line((px, self.top), (px, self.bottom), GRID, false);
            let l = tick_label(t);
            cv.text(
                px - Canvas::text_width(&l, 1) / 2,
                self.bottom + 8,
                &l,
                1,
                BLACK,
            );
        }
        cv.line(
            (self.left, self.bottom),
            (self.right, self.bottom),
            BLACK,
            false,
        );
        cv.line(
            (self.left, self.bottom),
            (self.left, self.top),
            BLACK,
            false,
        );
        let mid = (self.left + self.right) / 2;
        cv.text(
            mid - Canvas::text_width(spec.title, 2) / 2,
            12,
            spec.title,
            2,
            BLACK,
        );
        cv.text(
            mid - Canvas::text_width(spec.x_label, 1) / 2,
            H as i64 - 20,
            spec.x_label,
            1,
            BLACK,
        );
        cv.text(8, self.top - 14, spec.y_label, 1, BLACK);
    }
}
