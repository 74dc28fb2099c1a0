//! Reading a large CSV table into examples, against pandas (`bench/pandas_csv.py`, which reads the same file): 500,000
//! rows of 12 float features and a class label (about 70 MB), parsed on one thread and on every core.
//!
//! The file is written once into `$COHORT_BENCH_CSV` (default: `cohort-bench.csv` in the temporary directory), whose
//! path is printed; then run the Python side on it:
//!
//! ```text
//! cargo bench -p cohort-data --bench csv
//! python bench/pandas_csv.py /tmp/cohort-bench.csv
//! ```

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use cohort_data::Examples;
use cohort_data::rng::Rng;
use cohort_data::source::csv::{self, CsvSource};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const ROWS: usize = 500_000;
const FEATURES: usize = 12;

/// The benchmark's table, written unless it is there.
fn table() -> PathBuf {
    let path = std::env::var_os("COHORT_BENCH_CSV").map_or_else(
        || std::env::temp_dir().join("cohort-bench.csv"),
        PathBuf::from,
    );
    if !path.exists() {
        let tmp = path.with_extension("partial");
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp).expect("create the table"));
        let header: Vec<String> = (0..FEATURES).map(|i| format!("f{i}")).collect();
        writeln!(w, "{},label", header.join(",")).unwrap();
        let mut rng = Rng::new(11);
        for _ in 0..ROWS {
            for _ in 0..FEATURES {
                write!(w, "{:.6},", rng.normal()).unwrap();
            }
            writeln!(w, "{}", rng.below(10)).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        std::fs::rename(&tmp, &path).expect("finish the table");
    }
    println!("benchmark table: {}", path.display());
    path
}

fn bench_csv(c: &mut Criterion) {
    let path = table();
    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    let mut g = c.benchmark_group("csv_read");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    let opts = CsvSource {
        label: Some("label".into()),
        ..CsvSource::default()
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, cores] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool");
        g.bench_function(format!("cpu_{threads}thread"), |b| {
            b.iter(|| {
                let t = pool
                    .install(|| csv::open(&path, &opts, None))
                    .expect("read the table");
                assert_eq!(t.len(), ROWS);
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench_csv);
criterion_main!(benches);
