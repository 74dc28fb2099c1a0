//! Image folders: one subfolder per class holding PNG and JPEG files, like torchvision's `ImageFolder` and Keras'
//! `image_dataset_from_directory`.
//!
//! ```text
//! photos/cat/0001.jpg
//! photos/cat/0002.png
//! photos/dog/0001.jpeg
//! ```
//!
//! Opening a folder only lists it (and reads the first image's header when the images keep their own size);
//! [`Examples::example`] decodes one file, straight to 8-bit RGB or grey, resizes it and writes it channels
//! first as f32 in `[0, 1]`. That runs in the pipeline's parallel workers, so decoding scales with them.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::array::Array;
use crate::error::{Error, Result};
use crate::source::{Examples, Task};

/// How an image of another size is brought to [`ImageFolderSource::size`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Resize {
    /// Scale each side to the size, changing the aspect ratio.
    #[default]
    Stretch,
    /// Keep the aspect ratio: scale the short side to the size, then cut the middle out of the long side
    /// (torchvision `Resize(short)` then `CenterCrop(size)`). The middle is cut first and only it is scaled.
    Crop,
}

/// How an image folder becomes examples.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageFolderSource {
    /// `[height, width]` of every example; `None`: the images keep their size, which must be the first one's.
    pub size: Option<[usize; 2]>,
    /// How images of another size are brought to `size`.
    pub resize: Resize,
    /// 3 (RGB) or 1 (grey).
    pub channels: usize,
}

impl Default for ImageFolderSource {
    fn default() -> Self {
        ImageFolderSource {
            size: None,
            resize: Resize::Stretch,
            channels: 3,
        }
    }
}

/// The listed files of an image folder; [`Examples`] decodes them one by one.
pub struct ImageFolder {
    root: PathBuf,
    files: Vec<PathBuf>,
    labels: Vec<i32>,
    task: Task,
    /// `[C, H, W]`.
    shape: Vec<usize>,
    resize: Resize,
    /// The size every image must have when the source does not resize; with the file that set it.
    native: Option<([usize; 2], PathBuf)>,
}

impl fmt::Debug for ImageFolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageFolder")
            .field("root", &self.root)
            .field("files", &self.files.len())
            .field("classes", &self.classes().len())
            .field("shape", &self.shape)
            .field("resize", &self.resize)
            .finish()
    }
}

const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

fn is_image_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

/// What a folder entry is, symbolic links followed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Other,
}

/// The entries of `dir`, sorted by name. Their kinds come from the directory listing itself (no `stat` per file,
/// which counts on a folder of a million images), except for symbolic links.
fn sorted_entries(dir: &Path) -> Result<Vec<(PathBuf, Kind)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        let t = entry.file_type().map_err(|e| Error::io(&path, e))?;
        let kind = if t.is_symlink() {
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => Kind::Dir,
                Ok(m) if m.is_file() => Kind::File,
                _ => Kind::Other,
            }
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_file() {
            Kind::File
        } else {
            Kind::Other
        };
        out.push((path, kind));
    }
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn image_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Image {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// A list of names for a message, the first few only.
fn name_list(names: &[String]) -> String {
    const SHOWN: usize = 12;
    let mut s = names
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        s.push_str(&format!(", .. ({} in all)", names.len()));
    }
    s
}

/// List the image folder `root`: its subfolders (sorted by name, hidden ones skipped) are the classes, the
/// `.png`, `.jpg` and `.jpeg` files in each (any case, sorted by name; other files ignored) their examples.
/// `classes` (the training folder's [`ImageFolder::classes`], when opening its validation or test folder) fixes
/// the class list and ids instead: every subfolder must be one of them, and a class may have no subfolder.
///
/// Nothing is decoded here; when `opts.size` is `None`, the first image's header is read for the size that all
/// of them must have.
///
/// # Errors
/// [`Error::InvalidArgument`] for `channels` other than 1 or 3 or a zero size; [`Error::Io`] for a folder that
/// cannot be read; [`Error::Image`] for a root with no class folders, a class folder with no images, a subfolder
/// not among `classes`, or a first image whose header cannot be read.
pub fn open(
    root: &Path,
    opts: &ImageFolderSource,
    classes: Option<&[String]>,
) -> Result<ImageFolder> {
    if opts.channels != 1 && opts.channels != 3 {
        return Err(Error::InvalidArgument {
            op: "images",
            reason: format!(
                "channels = {} for {}: use 3 (RGB) or 1 (grey)",
                opts.channels,
                root.display()
            ),
        });
    }
    if let Some([h, w]) = opts.size {
        if h == 0 || w == 0 {
            return Err(Error::InvalidArgument {
                op: "images",
                reason: format!(
                    "size = [{h}, {w}] for {}: both height and width must be positive",
                    root.display()
                ),
            });
        }
    }
    let entries = sorted_entries(root)?;
    let folders: Vec<PathBuf> = entries
        .iter()
        .filter(|(p, k)| *k == Kind::Dir && !is_hidden(p))
        .map(|(p, _)| p.clone())
        .collect();
    if folders.is_empty() {
        let loose = entries.iter().filter(|(p, _)| is_image_file(p)).count();
        return Err(image_error(
            root,
            format!(
                "no class folders: an image folder holds one subfolder per class (cat/0001.jpg, dog/0001.jpg){}",
                if loose > 0 {
                    format!(
                        "; its {loose} images lie directly in it: move them into a folder per class"
                    )
                } else {
                    String::new()
                }
            ),
        ));
    }
    let names: Vec<String> = folders
        .iter()
        .map(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .collect();
    let class_names: Vec<String> = classes.map_or_else(|| names.clone(), <[String]>::to_vec);
    let mut files = Vec::new();
    let mut labels = Vec::new();
    for (folder, name) in folders.iter().zip(&names) {
        let id = class_names
            .iter()
            .position(|c| c == name)
            .ok_or_else(|| {
                image_error(
                    folder,
                    format!(
                        "class folder `{name}` is not one of the {} training classes ({}): rename or remove it, \
                         or train on a folder that has it",
                        class_names.len(),
                        name_list(&class_names)
                    ),
                )
            })?;
        let before = files.len();
        files.extend(
            sorted_entries(folder)?
                .into_iter()
                .filter(|(p, k)| *k == Kind::File && is_image_file(p))
                .map(|(p, _)| p),
        );
        if files.len() == before {
            return Err(image_error(
                folder,
                format!(
                    "class folder `{name}` holds no .png, .jpg or .jpeg files: add its images or remove the folder"
                ),
            ));
        }
        labels.resize(files.len(), id as i32);
    }
    let (size, native) = match opts.size {
        Some(size) => (size, None),
        None => {
            let first = &files[0];
            let (w, h) = image::ImageReader::open(first)
                .map_err(|e| Error::io(first, e))?
                .with_guessed_format()
                .map_err(|e| Error::io(first, e))?
                .into_dimensions()
                .map_err(|e| {
                    image_error(
                        first,
                        format!(
                            "cannot read the image's size: {e} (the first image sets the size of all; \
                             replace or remove the file)"
                        ),
                    )
                })?;
            let size = [h as usize, w as usize];
            (size, Some((size, first.clone())))
        }
    };
    Ok(ImageFolder {
        root: root.to_path_buf(),
        files,
        labels,
        task: Task::Classify {
            classes: class_names,
        },
        shape: vec![opts.channels, size[0], size[1]],
        resize: opts.resize,
        native,
    })
}

impl ImageFolder {
    /// The class names in id order.
    pub fn classes(&self) -> &[String] {
        match &self.task {
            Task::Classify { classes } => classes,
            _ => &[],
        }
    }

    /// The file of example `i`, or `None` past the end.
    pub fn path(&self, i: usize) -> Option<&Path> {
        self.files.get(i).map(PathBuf::as_path)
    }

    /// The folder that was opened.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Decode image `i` into `out` (cleared first): `[C, H, W]` f32 in `[0, 1]`.
    ///
    /// # Errors
    /// As [`Examples::example`].
    pub fn decode_into(&self, i: usize, out: &mut Vec<f32>) -> Result<()> {
        let path = self.files.get(i).ok_or_else(|| Error::InvalidArgument {
            op: "images",
            reason: format!(
                "example {i} of {} in {}",
                self.files.len(),
                self.root.display()
            ),
        })?;
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let format = match image::guess_format(&bytes) {
            Ok(f @ (image::ImageFormat::Png | image::ImageFormat::Jpeg)) => f,
            _ => {
                return Err(image_error(
                    path,
                    format!(
                        "not a PNG or JPEG image (it starts with bytes {:02x?}): convert or remove the file",
                        &bytes[..bytes.len().min(8)]
                    ),
                ));
            }
        };
        if format == image::ImageFormat::Jpeg && !jpeg_is_complete(&bytes) {
            return Err(image_error(
                path,
                "cannot decode the JPEG image: it is truncated (no end-of-image marker after its last scan): \
                 copy it again or remove it",
            ));
        }
        let decoded = image::load_from_memory_with_format(&bytes, format).map_err(|e| {
            image_error(
                path,
                format!(
                    "cannot decode the {format:?} image: {e} (the file is truncated or corrupt: copy it again or remove it)"
                ),
            )
        })?;
        drop(bytes);
        let [c, h, w] = [self.shape[0], self.shape[1], self.shape[2]];
        let (iw, ih) = (decoded.width() as usize, decoded.height() as usize);
        if let Some(([nh, nw], first)) = &self.native {
            if (ih, iw) != (*nh, *nw) {
                return Err(image_error(
                    path,
                    format!(
                        "is {iw}x{ih} (width x height) but the folder's first image {} is {nw}x{nh}: give all \
                         images one size, or set a size to resize them to",
                        first.display()
                    ),
                ));
            }
        }
        let pixels = if c == 3 {
            decoded.into_rgb8().into_raw()
        } else {
            decoded.into_luma8().into_raw()
        };
        let region = match self.resize {
            Resize::Stretch => [0, 0, iw, ih],
            Resize::Crop => center_crop(iw, ih, w, h),
        };
        out.clear();
        write_chw(&pixels, iw, c, region, h, w, out);
        Ok(())
    }
}

/// Whether a JPEG's last scan is followed by its end-of-image marker. The decoder fills a cut-off scan with grey
/// and reports success (as libjpeg does with a warning); PIL refuses such a file, and so do we. `FF D9` (end of
/// image) and `FF DA` (start of scan) cannot occur inside entropy-coded data (an `FF` there is followed by `00`
/// or a restart marker), and an embedded thumbnail's end comes before the main image's scans.
fn jpeg_is_complete(bytes: &[u8]) -> bool {
    // the end marker is normally the last two bytes: the search stops there
    match bytes.windows(2).rposition(|w| w == [0xFF, 0xD9]) {
        Some(end) => !bytes[end..].windows(2).any(|w| w == [0xFF, 0xDA]),
        None => false,
    }
}

/// The middle `[x0, y0, width, height]` of a `iw x ih` image with the aspect ratio of `w x h`.
fn center_crop(iw: usize, ih: usize, w: usize, h: usize) -> [usize; 4] {
    // compare iw / ih with w / h without rounding
    let (cw, ch) = if iw * h > w * ih {
        (((ih * w) as f64 / h as f64).round().max(1.0) as usize, ih)
    } else {
        (iw, ((iw * h) as f64 / w as f64).round().max(1.0) as usize)
    };
    let (cw, ch) = (cw.min(iw), ch.min(ih));
    [(iw - cw) / 2, (ih - ch) / 2, cw, ch]
}

/// Per output index along one axis: the first input index and the weights of the inputs from there (a triangle
/// filter widened by the downscale factor, so that shrinking averages every input, as PIL's bilinear resize does).
struct Taps {
    start: Vec<usize>,
    len: Vec<usize>,
    /// `len.max()` weights per output, zero-padded.
    weights: Vec<f32>,
    stride: usize,
}

impl Taps {
    fn new(input: usize, output: usize) -> Taps {
        let scale = input as f64 / output as f64;
        let support = scale.max(1.0);
        let stride = (support.ceil() as usize) * 2 + 1;
        let mut taps = Taps {
            start: Vec::with_capacity(output),
            len: Vec::with_capacity(output),
            weights: vec![0.0; output * stride],
            stride,
        };
        for o in 0..output {
            let center = (o as f64 + 0.5) * scale;
            let lo = ((center - support).floor().max(0.0) as usize).min(input - 1);
            let hi = ((center + support).ceil() as usize).clamp(lo + 1, input);
            let hi = hi.min(lo + stride);
            let ws = &mut taps.weights[o * stride..o * stride + (hi - lo)];
            let mut sum = 0.0;
            for (k, wt) in ws.iter_mut().enumerate() {
                let d = ((lo + k) as f64 + 0.5 - center) / support;
                let v = (1.0 - d.abs()).max(0.0);
                *wt = v as f32;
                sum += v;
            }
            if sum > 0.0 {
                ws.iter_mut()
                    .for_each(|w| *w = (f64::from(*w) / sum) as f32);
            } else {
                ws[0] = 1.0;
            }
            taps.start.push(lo);
            taps.len.push(hi - lo);
        }
        taps
    }

    fn of(&self, o: usize) -> (usize, &[f32]) {
        let at = o * self.stride;
        (self.start[o], &self.weights[at..at + self.len[o]])
    }
}

/// Write the `region` (`[x0, y0, width, height]`) of interleaved 8-bit `pixels` (rows of `stride` pixels of `c`
/// channels) scaled to `h x w`, channels first, as f32 in `[0, 1]`, appending to `out`. A region of the output
/// size is only converted; otherwise one separable resize: columns to the new height, then rows to the new width.
fn write_chw(
    pixels: &[u8],
    stride: usize,
    c: usize,
    region: [usize; 4],
    h: usize,
    w: usize,
    out: &mut Vec<f32>,
) {
    let [x0, y0, rw, rh] = region;
    out.reserve(c * h * w);
    if (rw, rh) == (w, h) {
        let at = out.len();
        out.resize(at + c * h * w, 0.0);
        let dst = &mut out[at..];
        let rows = (y0..y0 + h).map(|y| &pixels[(y * stride + x0) * c..(y * stride + x0 + w) * c]);
        if c == 1 {
            for (o, row) in dst.chunks_exact_mut(w).zip(rows) {
                for (a, &p) in o.iter_mut().zip(row) {
                    *a = f32::from(p) / 255.0;
                }
            }
        } else {
            // one pass over the interleaved pixels, writing the three planes
            let (r, rest) = dst.split_at_mut(h * w);
            let (g, b) = rest.split_at_mut(h * w);
            let planes = r
                .chunks_exact_mut(w)
                .zip(g.chunks_exact_mut(w))
                .zip(b.chunks_exact_mut(w));
            for (((r, g), b), row) in planes.zip(rows) {
                for (x, p) in row.chunks_exact(3).enumerate() {
                    r[x] = f32::from(p[0]) / 255.0;
                    g[x] = f32::from(p[1]) / 255.0;
                    b[x] = f32::from(p[2]) / 255.0;
                }
            }
        }
        return;
    }
    let (hx, vy) = (Taps::new(rw, w), Taps::new(rh, h));
    // columns first, on whole interleaved rows (contiguous, so it vectorises): [h][rw * c], in 0..=255
    let span = rw * c;
    let mut tmp = vec![0f32; h * span];
    for (oy, t) in tmp.chunks_exact_mut(span).enumerate() {
        let (s, ws) = vy.of(oy);
        for (k, &wt) in ws.iter().enumerate() {
            let at = ((y0 + s + k) * stride + x0) * c;
            for (a, &p) in t.iter_mut().zip(&pixels[at..at + span]) {
                *a += wt * f32::from(p);
            }
        }
    }
    // then rows, into the channel planes; the 1/255 folded into the weights
    let at = out.len();
    out.resize(at + c * h * w, 0.0);
    let dst = &mut out[at..];
    let scaled: Vec<f32> = hx.weights.iter().map(|w| w / 255.0).collect();
    let tap = |ox: usize| {
        let (s, ws) = hx.of(ox);
        (s, &scaled[ox * hx.stride..ox * hx.stride + ws.len()])
    };
    for (oy, t) in tmp.chunks_exact(span).enumerate() {
        if c == 3 {
            let (r, rest) = dst.split_at_mut(h * w);
            let (g, b) = rest.split_at_mut(h * w);
            let row = oy * w..(oy + 1) * w;
            let (r, g, b) = (&mut r[row.clone()], &mut g[row.clone()], &mut b[row]);
            for ox in 0..w {
                let (s, ws) = tap(ox);
                let (mut ar, mut ag, mut ab) = (0.0f32, 0.0f32, 0.0f32);
                for (px, &wt) in t[s * 3..].chunks_exact(3).zip(ws) {
                    ar += wt * px[0];
                    ag += wt * px[1];
                    ab += wt * px[2];
                }
                r[ox] = ar.min(1.0);
                g[ox] = ag.min(1.0);
                b[ox] = ab.min(1.0);
            }
        } else {
            for ch in 0..c {
                for ox in 0..w {
                    let (s, ws) = tap(ox);
                    let acc: f32 = ws
                        .iter()
                        .enumerate()
                        .map(|(k, &wt)| wt * t[(s + k) * c + ch])
                        .sum();
                    dst[(ch * h + oy) * w + ox] = acc.min(1.0);
                }
            }
        }
    }
}

impl Examples for ImageFolder {
    fn len(&self) -> usize {
        self.files.len()
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn task(&self) -> &Task {
        &self.task
    }

    fn labels(&self) -> Option<&[i32]> {
        Some(&self.labels)
    }

    /// Decode file `i`: `x` f32 `[C, H, W]` in `[0, 1]`, `y` its class id.
    ///
    /// # Errors
    /// [`Error::Io`] for a file that cannot be read; [`Error::Image`] naming the file when it is not a PNG or
    /// JPEG, does not decode (truncated, corrupt), or has another size than the first image when nothing resizes.
    fn example(&self, i: usize) -> Result<(Array, Array)> {
        let mut x = Vec::new();
        self.decode_into(i, &mut x)?;
        Ok((
            Array::from_f32(x, &self.shape)?,
            Array::scalar_i32(self.labels[i]),
        ))
    }

    fn verify(&self) -> Result<()> {
        use rayon::prelude::*;
        // In parallel, each worker decoding into one buffer; the lowest failing index is the error reported.
        (0..self.files.len())
            .into_par_iter()
            .try_for_each_init(Vec::new, |buf, i| self.decode_into(i, buf))
            .map_err(|first| {
                (0..self.files.len())
                    .find_map(|i| self.decode_into(i, &mut Vec::new()).err())
                    .unwrap_or(first)
            })
    }

    fn describe(&self) -> String {
        format!(
            "images {} ({} classes, {} files, each [{}, {}, {}])",
            self.root.display(),
            self.classes().len(),
            self.files.len(),
            self.shape[0],
            self.shape[1],
            self.shape[2]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_sum_to_one_and_stay_in_bounds() {
        for (i, o) in [(64, 56), (56, 64), (100, 7), (3, 10), (1, 4), (4, 1)] {
            let t = Taps::new(i, o);
            for k in 0..o {
                let (s, ws) = t.of(k);
                assert!(s + ws.len() <= i, "{i}->{o} output {k}");
                let sum: f32 = ws.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "{i}->{o} output {k}: {sum}");
            }
        }
    }

    #[test]
    fn resize_keeps_a_constant_image_and_a_gradient_monotone() {
        // constant 200 in a 10x6 RGB image, scaled to 4x3
        let px = vec![200u8; 10 * 6 * 3];
        let mut out = Vec::new();
        write_chw(&px, 10, 3, [0, 0, 10, 6], 3, 4, &mut out);
        assert_eq!(out.len(), 3 * 3 * 4);
        assert!(
            out.iter().all(|&v| (v - 200.0 / 255.0).abs() < 1e-5),
            "{out:?}"
        );
        // a horizontal ramp stays increasing along x when upscaled
        let px: Vec<u8> = (0..4).flat_map(|_| (0..8).map(|x| x * 30)).collect();
        out.clear();
        write_chw(&px, 8, 1, [0, 0, 8, 4], 4, 13, &mut out);
        assert!(out[..13].windows(2).all(|p| p[0] <= p[1]), "{out:?}");
    }

    #[test]
    fn jpeg_end_marker_after_the_last_scan() {
        let (soi, sos, eoi) = ([0xFF, 0xD8], [0xFF, 0xDA], [0xFF, 0xD9]);
        let whole = [&soi[..], &sos, &[1, 2, 0xFF, 0x00, 3], &eoi].concat();
        assert!(jpeg_is_complete(&whole));
        assert!(!jpeg_is_complete(&whole[..whole.len() - 1]));
        // an embedded thumbnail ends before the main scan, which is cut off
        let thumb = [&soi[..], &sos, &[7], &eoi, &sos, &[1, 2, 3]].concat();
        assert!(!jpeg_is_complete(&thumb));
    }

    #[test]
    fn center_crop_keeps_the_aspect_ratio() {
        assert_eq!(center_crop(100, 50, 10, 10), [25, 0, 50, 50]);
        assert_eq!(center_crop(50, 100, 10, 10), [0, 25, 50, 50]);
        assert_eq!(center_crop(64, 64, 32, 32), [0, 0, 64, 64]);
        assert_eq!(center_crop(60, 40, 20, 10), [0, 5, 60, 30]);
    }
}
