//! An image folder through the pipeline against PyTorch's `DataLoader` with torchvision (`bench/torch_images.py`,
//! which reads the same folder): 2,000 JPEGs of 64x64 RGB in 10 class folders, decoded, then either
//! random-cropped from a 4-pixel zero padding and flipped (CIFAR-style augmentation) or resized to 56x56, written
//! channels first as f32 and batched by 64, with 1 and 2 decoding workers.
//!
//! The folder is generated once into `$COHORT_BENCH_IMAGES` (default: `cohort-bench-images` in the temporary
//! directory), whose path is printed; then run the Python side on it:
//!
//! ```text
//! cargo bench -p cohort-data --bench images
//! python bench/torch_images.py /tmp/cohort-bench-images
//! ```

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cohort_data::augment::Augment;
use cohort_data::rng::{Rng, mix};
use cohort_data::source::images::{self, ImageFolder, ImageFolderSource};
use cohort_data::{Array, Dataset, Examples};
use criterion::{Criterion, Throughput, criterion_group};

const CLASSES: usize = 10;
const PER_CLASS: usize = 200;
const SIDE: u32 = 64;
const BATCH: usize = 64;
const SEED: u64 = 7;

/// A photo-like 64x64 image: a class-tinted gradient, a few soft-edged discs, mild noise (so that the JPEG has
/// the detail of a real thumbnail, not flat blocks).
fn picture(class: usize, index: usize) -> image::RgbImage {
    let mut rng = Rng::new(mix(class as u64, index as u64));
    let tint = [
        (class * 25) % 256,
        (class * 70 + 80) % 256,
        (255 - class * 20) % 256,
    ]
    .map(|v| v as f32);
    let discs: Vec<(f32, f32, f32, [f32; 3])> = (0..4)
        .map(|_| {
            let c = [0, 1, 2].map(|_| rng.below(256) as f32);
            (
                rng.below(64) as f32,
                rng.below(64) as f32,
                4.0 + rng.below(14) as f32,
                c,
            )
        })
        .collect();
    image::RgbImage::from_fn(SIDE, SIDE, |x, y| {
        let (fx, fy) = (x as f32, y as f32);
        let mut px = [0, 1, 2].map(|c| tint[c] * (0.4 + 0.6 * (fx + fy) / 128.0));
        for &(cx, cy, r, col) in &discs {
            let d = ((fx - cx).powi(2) + (fy - cy).powi(2)).sqrt();
            let a = (r + 1.0 - d).clamp(0.0, 1.0);
            for c in 0..3 {
                px[c] = px[c] * (1.0 - a) + col[c] * a;
            }
        }
        let noise = (rng.below(21) as f32) - 10.0;
        image::Rgb(px.map(|v| (v + noise).clamp(0.0, 255.0) as u8))
    })
}

/// The benchmark's folder, written unless a complete one is there.
fn folder() -> PathBuf {
    let root = std::env::var_os("COHORT_BENCH_IMAGES").map_or_else(
        || std::env::temp_dir().join("cohort-bench-images"),
        PathBuf::from,
    );
    let done = root.join("complete");
    if !done.exists() {
        for c in 0..CLASSES {
            let dir = root.join(format!("class_{c}"));
            std::fs::create_dir_all(&dir).expect("create the benchmark's folder");
            for i in 0..PER_CLASS {
                let file = std::fs::File::create(dir.join(format!("{i:04}.jpg")))
                    .expect("create an image");
                let mut w = std::io::BufWriter::new(file);
                image::codecs::jpeg::JpegEncoder::new_with_quality(&mut w, 90)
                    .encode_image(&picture(c, i))
                    .expect("encode a JPEG");
            }
        }
        std::fs::write(&done, "").expect("mark the folder complete");
    }
    println!("benchmark images: {}", root.display());
    root
}

/// What each example goes through after decoding.
#[derive(Clone, Copy)]
enum Work {
    /// 64x64 kept, random crop from a 4-pixel padding and a horizontal flip.
    CropFlip,
    /// Resized to 56x56.
    Resize56,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::CropFlip => "crop_flip",
            Work::Resize56 => "resize56",
        }
    }
}

fn open(root: &Path, work: Work) -> Arc<ImageFolder> {
    let opts = match work {
        Work::CropFlip => ImageFolderSource::default(),
        Work::Resize56 => ImageFolderSource {
            size: Some([56, 56]),
            ..ImageFolderSource::default()
        },
    };
    Arc::new(images::open(root, &opts, None).expect("open the benchmark's folder"))
}

/// The pipeline as a trainer builds it: indices, decoding (and augmenting) in `workers` threads, batches of 64.
fn pipeline(folder: &Arc<ImageFolder>, work: Work, workers: usize) -> Dataset<(Array, Array)> {
    let aug = match work {
        Work::CropFlip => Augment {
            crop_padding: 4,
            flip: true,
        },
        Work::Resize56 => Augment::default(),
    };
    let f = Arc::clone(folder);
    Dataset::from_vec((0..folder.len()).collect::<Vec<usize>>())
        .map_seeded("augmented", workers, SEED, move |i, rng| {
            let (x, y) = f.example(i)?;
            if aug.is_identity() {
                return Ok((x, y));
            }
            let shape = x.shape().to_vec();
            let mut v = x.into_f32().unwrap_or_default();
            aug.apply(&mut v, &shape, rng);
            Ok((Array::from_f32(v, &shape)?, y))
        })
        .batch(BATCH, false)
}

/// One epoch; the number of images it gave.
fn epoch(ds: &Dataset<(Array, Array)>) -> usize {
    ds.iter()
        .map(|b| {
            let (x, _) = b.expect("a batch");
            black_box(x.as_f32().map_or(0.0, |v| v[0]));
            x.shape()[0]
        })
        .sum()
}

fn bench_images(c: &mut Criterion) {
    let root = folder();
    let n = (CLASSES * PER_CLASS) as u64;
    let mut g = c.benchmark_group("image_folder_epoch");
    g.throughput(Throughput::Elements(n));
    g.sample_size(10).measurement_time(Duration::from_secs(6));
    for work in [Work::CropFlip, Work::Resize56] {
        let f = open(&root, work);
        for workers in [1, 2] {
            let ds = pipeline(&f, work, workers);
            g.bench_function(format!("cpu_{}_{workers}worker", work.name()), |b| {
                b.iter(|| assert_eq!(epoch(&ds) as u64, n));
            });
        }
    }
    g.finish();
}

/// CPU seconds of this process, all threads: work done, which a loaded host does not inflate as it does wall time.
#[cfg(target_os = "linux")]
fn process_cpu_s() -> Option<f64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

#[cfg(not(target_os = "linux"))]
fn process_cpu_s() -> Option<f64> {
    None
}

/// Images per second (the median of 7 epochs after a warm-up) and images per CPU second (all 7 epochs, every
/// thread), in the form `bench/torch_images.py` prints.
fn figures() {
    let root = folder();
    println!(
        "\n{:<12} {:>8} {:>12} {:>16}",
        "work", "workers", "images/s", "images/cpu-s"
    );
    for work in [Work::CropFlip, Work::Resize56] {
        let f = open(&root, work);
        for workers in [1, 2] {
            let ds = pipeline(&f, work, workers);
            epoch(&ds);
            let (cpu0, mut images) = (process_cpu_s(), 0);
            let mut rates: Vec<f64> = (0..7)
                .map(|_| {
                    let t = Instant::now();
                    let k = epoch(&ds);
                    images += k;
                    k as f64 / t.elapsed().as_secs_f64()
                })
                .collect();
            let per_cpu = match (cpu0, process_cpu_s()) {
                (Some(a), Some(b)) => images as f64 / (b - a),
                _ => f64::NAN,
            };
            rates.sort_by(f64::total_cmp);
            println!(
                "{:<12} {:>8} {:>12.0} {:>16.0}",
                work.name(),
                workers,
                rates[rates.len() / 2],
                per_cpu
            );
        }
    }
}

criterion_group!(benches, bench_images);

fn main() {
    benches();
    figures();
    Criterion::default().configure_from_args().final_summary();
}
