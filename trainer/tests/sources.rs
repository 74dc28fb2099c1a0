//! Every kind of source trains from a config, on files the test writes with a learnable pattern: CSV (classes
//! and a regression), NumPy `.npy` and `.npz`, a PNG folder (normalised and augmented), CIFAR binary batches, a
//! 4-D IDX array, a token corpus (a language model), synthetic token sequences. Accuracy clearly above chance (or
//! a loss clearly below the baseline's) is asserted, validation is scored every epoch and picks the best member,
//! and bad files end the run before training with the file and the record named.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

mod common;

use cohort_data::Rng;
use cohort_trainer::cohort::{RunOptions, train};
use cohort_trainer::config::Config;
use cohort_trainer::report::{MemberSummary, Summary};

/// Trains the members of `members` (TOML `[[member]]` tables) on `[data.d]` = `data`, on the CPU.
fn run(dir: &Path, name: &str, data: &str, members: &str, epochs: u32) -> Summary {
    let text = format!(
        "[run]\nname = \"{name}\"\ndir = \"{d}/runs\"\ndevice = \"cpu\"\nwarmup = false\nepochs = {epochs}\n\n\
         [data.d]\n{data}\n\n{members}",
        d = dir.display()
    );
    let config = written(dir, name, &text);
    train(config, RunOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .summary
        .unwrap()
}

/// The error a run of this data set ends with, before training.
fn refused(dir: &Path, data: &str) -> String {
    let text = format!(
        "[run]\nname = \"bad\"\ndir = \"{d}/runs\"\ndevice = \"cpu\"\nwarmup = false\n\n[data.d]\n{data}\n\n{MLP}",
        d = dir.display()
    );
    let config = written(dir, "bad", &text);
    train(config, RunOptions::default())
        .expect_err("the run is refused")
        .to_string()
}

/// A config written to `dir/NAME.toml` and read back, so that its paths are relative to `dir`.
fn written(dir: &Path, name: &str, text: &str) -> Config {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"))
}

const MLP: &str = r#"
[[member]]
name = "mlp"
model = { layers = [{ flatten = true }, { linear = 32, act = "relu" }, { linear = 10 }] }
optimizer = { adam = { lr = 3e-3 } }
batch = 16
data = "d"
"#;

fn member<'a>(s: &'a Summary, name: &str) -> &'a MemberSummary {
    s.members.iter().find(|m| m.name == name).unwrap()
}

fn acc(m: &MemberSummary) -> f64 {
    m.test_accuracy.unwrap_or_else(|| panic!("{m:?}"))
}

/// A `.npy` array (C order) of `descr` from raw little-endian bytes.
fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    cohort_data::source::npy::encode_npy(descr, shape, false, data)
}

/// `n` examples of 8 features in 3 Gaussian clusters by class: `(features, class)`.
fn clusters(n: usize, seed: u64) -> Vec<([f32; 8], usize)> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let c = i % 3;
            let mut x = [0f32; 8];
            for (k, v) in x.iter_mut().enumerate() {
                let centre = if k % 3 == c { 2.0 } else { 0.0 };
                *v = centre + rng.normal() as f32 * 0.7;
            }
            (x, c)
        })
        .collect()
}

#[test]
fn csv_tables_train_classes_by_name_and_a_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let names = ["cat", "dog", "eel"];
    let table = |rows: &[([f32; 8], usize)]| {
        let mut s = "f0,f1,f2,f3,f4,f5,f6,f7,animal\n".to_string();
        for (x, c) in rows {
            for v in x {
                write!(s, "{v},").unwrap();
            }
            writeln!(s, "{}", names[*c]).unwrap();
        }
        s
    };
    std::fs::write(d.join("train.csv"), table(&clusters(600, 1))).unwrap();
    std::fs::write(d.join("test.csv"), table(&clusters(150, 2))).unwrap();
    let s = run(
        d,
        "csv",
        r#"source = { csv = "train.csv", test = "test.csv", label = "animal" }
val = 0.2
normalize = true"#,
        &MLP.replace("linear = 10", "linear = 3"),
        4,
    );
    let m = member(&s, "mlp");
    assert!(acc(m) > 0.85, "{m:?}");
    assert!(m.val_accuracy.unwrap() > 0.85, "{m:?}");
    assert_eq!(
        m.val.as_ref().unwrap().examples,
        120,
        "a fifth of 600, stratified"
    );

    // y = 2 f0 - f1 + noise: the mean squared error falls far below the targets' variance (about 5).
    let mut rng = Rng::new(3);
    let mut s = "a,b,c,y\n".to_string();
    for _ in 0..800 {
        let (a, b, c) = (rng.normal(), rng.normal(), rng.normal());
        writeln!(s, "{a},{b},{c},{}", 2.0 * a - b + 0.05 * rng.normal()).unwrap();
    }
    std::fs::write(d.join("reg.csv"), s).unwrap();
    let s = run(
        d,
        "regress",
        r#"source = { csv = "reg.csv", label = "y", task = "regress" }
val = 0.1
test = 0.1"#,
        r#"[[member]]
name = "linear"
model = { layers = [{ linear = 1 }] }
optimizer = { adam = { lr = 3e-2 } }
batch = 32
data = "d""#,
        8,
    );
    let m = member(&s, "linear");
    let test = m.test.as_ref().unwrap();
    assert!(test.accuracy.is_none(), "{test:?}");
    assert!(test.loss < 0.1, "test MSE {test:?}");
    assert_eq!(test.examples, 80);
}

#[test]
fn npy_and_npz_arrays_train_from_any_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let rows = clusters(600, 4);
    // features [n, 2, 4] as float32, labels int64
    let x: Vec<u8> = rows
        .iter()
        .flat_map(|(x, _)| x.iter().flat_map(|v| v.to_le_bytes()))
        .collect();
    let y: Vec<u8> = rows
        .iter()
        .flat_map(|(_, c)| (*c as i64).to_le_bytes())
        .collect();
    let (xa, ya) = (npy("<f4", &[600, 2, 4], &x), npy("<i8", &[600], &y));
    std::fs::write(d.join("x.npy"), &xa).unwrap();
    std::fs::write(d.join("y.npy"), &ya).unwrap();
    let s = run(
        d,
        "npy",
        r#"source = { npy = { x = "x.npy", y = "y.npy" } }
val = 0.1
test = 0.2"#,
        &MLP.replace("linear = 10", "linear = 3"),
        4,
    );
    let m = member(&s, "mlp");
    assert!(acc(m) > 0.85, "{m:?}");
    assert!(m.val_accuracy.unwrap() > 0.8, "{m:?}");

    let file = std::fs::File::create(d.join("data.npz")).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let opts = zip::write::FileOptions::default();
    zip.start_file("features.npy", opts).unwrap();
    zip.write_all(&xa).unwrap();
    zip.start_file("labels.npy", opts).unwrap();
    zip.write_all(&ya).unwrap();
    zip.finish().unwrap();
    let s = run(
        d,
        "npz",
        r#"source = { npz = "data.npz", x = "features", y = "labels" }
test = 0.2"#,
        &MLP.replace("linear = 10", "linear = 3"),
        4,
    );
    assert!(acc(member(&s, "mlp")) > 0.85);

    // the labels' length differs from the features'
    std::fs::write(d.join("short.npy"), npy("<i8", &[599], &y[..599 * 8])).unwrap();
    let e = refused(
        d,
        r#"source = { npy = { x = "x.npy", y = "short.npy" } }
test = 0.2"#,
    );
    assert!(
        e.contains("short.npy") && e.contains("599") && e.contains("600"),
        "{e}"
    );
}

/// A 12×12 greyscale-looking RGB image: class 0 bright on top, class 1 bright at the bottom, with noise.
fn picture(class: usize, rng: &mut Rng) -> image::RgbImage {
    image::RgbImage::from_fn(12, 12, |_, y| {
        let bright = (y < 6) == (class == 0);
        let base = if bright { 200.0 } else { 40.0 };
        let v = (base + rng.normal() * 25.0).clamp(0.0, 255.0) as u8;
        image::Rgb([v, v / 2, 255 - v])
    })
}

#[test]
fn an_image_folder_trains_normalised_and_augmented_and_resumes_at_the_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let mut rng = Rng::new(5);
    for (split, n) in [("train", 60), ("test", 15)] {
        for (c, class) in ["top", "bottom"].iter().enumerate() {
            let dir = d.join(split).join(class);
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..n {
                picture(c, &mut rng)
                    .save(dir.join(format!("{i}.png")))
                    .unwrap();
            }
        }
    }
    let data = r#"source = { images = { train = "train", test = "test" }, size = [8, 8] }
val = 0.1
normalize = true
augment = { crop_padding = 1, flip = true }
workers = 2"#;
    let cnn = r#"
[[member]]
name = "cnn"
model = { layers = [{ conv = 8, kernel = 3, act = "relu" }, { maxpool = 2 }, { flatten = true }, { linear = 2 }] }
optimizer = { adam = { lr = 3e-3 } }
batch = 12
data = "d"
checkpoint = { every = 5 }
"#;
    let s = run(d, "images", data, cnn, 4);
    let m = member(&s, "cnn");
    assert!(acc(m) > 0.85, "{m:?}");
    assert_eq!(m.test.as_ref().unwrap().examples, 30);
    assert_eq!(m.val.as_ref().unwrap().examples, 12);

    // Killed after 7 steps and resumed, an MLP (whose CPU steps are deterministic) on the augmented images ends
    // bit-identical to the run that was never stopped: the crops and flips continue at the very batch.
    let config = |name: &str| {
        let text = format!(
            "[run]\nname = \"{name}\"\ndir = \"{d}/runs\"\ndevice = \"cpu\"\nwarmup = false\nepochs = 2\n\n\
             [data.d]\n{data}\n\n{MLP}checkpoint = {{ every = 5 }}\n",
            d = d.display(),
            MLP = MLP.replace("linear = 10", "linear = 2")
        );
        written(d, name, &text)
    };
    let full = train(config("full"), RunOptions::default()).unwrap();
    let halted = train(
        config("halted"),
        RunOptions {
            halt_after_steps: Some(7),
            ..RunOptions::default()
        },
    )
    .unwrap();
    assert!(halted.summary.is_none());
    let resumed = cohort_trainer::cohort::resume(&halted.run_dir, RunOptions::default()).unwrap();
    assert_eq!(
        common::final_tensors(&full.run_dir, "mlp"),
        common::final_tensors(&resumed.run_dir, "mlp"),
        "the resumed run's parameters and optimizer state"
    );
}

#[test]
fn cifar_batches_and_a_4d_idx_array_train() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let mut rng = Rng::new(6);
    // CIFAR-10: class 0 red images, class 1 blue ones, 20 records a file
    let record = |class: u8, rng: &mut Rng| {
        let mut r = vec![class];
        for plane in 0..3u8 {
            let hot = (plane == 0) == (class == 0) && plane != 1;
            for _ in 0..1024 {
                let base = if hot { 180.0 } else { 60.0 };
                r.push((base + rng.normal() * 30.0).clamp(0.0, 255.0) as u8);
            }
        }
        r
    };
    let dir = d.join("cifar");
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "test_batch",
    ] {
        let bytes: Vec<u8> = (0..20)
            .flat_map(|i| record((i % 2) as u8, &mut rng))
            .collect();
        std::fs::write(dir.join(format!("{f}.bin")), bytes).unwrap();
    }
    let s = run(
        d,
        "cifar",
        r#"source = { cifar = "cifar" }
val = 0.1"#,
        MLP,
        3,
    );
    assert!(acc(member(&s, "mlp")) > 0.85);

    // IDX [n, 4, 4, 3] u8 in height-width-channel order: the class is the brightest channel.
    let idx = d.join("idx");
    std::fs::create_dir_all(&idx).unwrap();
    for (prefix, n) in [("train", 300), ("t10k", 60)] {
        let mut px = Vec::new();
        let mut labels = Vec::new();
        for i in 0..n {
            let c = i % 3;
            for _ in 0..16 {
                for ch in 0..3 {
                    let base = if ch == c { 200.0 } else { 70.0 };
                    px.push((base + rng.normal() * 30.0).clamp(0.0, 255.0) as u8);
                }
            }
            labels.push(c as u8);
        }
        let images = cohort_data::IdxArray {
            dims: vec![n, 4, 4, 3],
            data: cohort_data::IdxData::U8(px),
        };
        let labels = cohort_data::IdxArray {
            dims: vec![n],
            data: cohort_data::IdxData::U8(labels),
        };
        std::fs::write(
            idx.join(format!("{prefix}-images-idx4-ubyte")),
            cohort_data::idx::encode_idx(&images),
        )
        .unwrap();
        std::fs::write(
            idx.join(format!("{prefix}-labels-idx1-ubyte")),
            cohort_data::idx::encode_idx(&labels),
        )
        .unwrap();
    }
    let s = run(
        d,
        "idx",
        r#"source = { idx = "idx", layout = "hwc" }"#,
        &MLP.replace("linear = 10", "linear = 3"),
        3,
    );
    assert!(acc(member(&s, "mlp")) > 0.85);
}

#[test]
fn a_language_model_learns_a_corpus_and_reports_perplexity() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let sentences = [
        "the cat sat on the mat. ",
        "a dog ate my hat. ",
        "we ran to the sea. ",
    ];
    let mut rng = Rng::new(7);
    let corpus: String = (0..300).map(|_| sentences[rng.below(3) as usize]).collect();
    std::fs::write(d.join("corpus.txt"), &corpus).unwrap();
    let lm = r#"
[[member]]
name = "lm"
model = { layers = [{ embedding = 32, vocab = 40 }, { positional = 16 }, { transformer = 2, causal = true }, { linear = 40 }] }
optimizer = { adam = { lr = 3e-3 } }
batch = 16
data = "d"
"#;
    let s = run(
        d,
        "lm",
        r#"source = { tokens = "corpus.txt", tokenizer = "chars", window = 16 }
val = 0.1
test = 0.1"#,
        lm,
        6,
    );
    let m = member(&s, "lm");
    let t = m.test.as_ref().unwrap();
    // About 20 characters in use: a uniform guess has a perplexity of 20; these sentences are mostly predictable.
    assert!(t.perplexity.unwrap() < 4.0, "{t:?}");
    assert!(t.accuracy.unwrap() > 0.5, "{t:?}");
    assert!(m.val.as_ref().unwrap().perplexity.is_some());

    // A corpus shorter than one window
    std::fs::write(d.join("short.txt"), "too short").unwrap();
    let e = refused(
        d,
        r#"source = { tokens = "short.txt", window = 16 }
test = 0.5"#,
    );
    assert!(e.contains("short.txt") && e.contains("16"), "{e}");
}

#[test]
fn synthetic_token_sequences_train_a_classifier_and_validation_picks_the_best() {
    let tmp = tempfile::tempdir().unwrap();
    let reader = r#"
[[member]]
name = "reader"
model = { layers = [{ embedding = 16, vocab = 50 }, { pool = "mean" }, { linear = 4 }] }
optimizer = { adam = { lr = [1e-4, 1e-2] } }
batch = 32
data = "d"
"#;
    let s = run(
        tmp.path(),
        "tokens",
        r#"source = { synthetic = { train = 800, test = 200, len = 12, vocab = 50, classes = 4 } }
val = 0.1
top_k = 2"#,
        reader,
        3,
    );
    let (slow, fast) = (member(&s, "reader-lr1e-4"), member(&s, "reader-lr0.01"));
    assert!(acc(fast) > 0.8, "{fast:?}");
    assert!(fast.test.as_ref().unwrap().top_k.unwrap() >= acc(fast));
    assert!(fast.val_accuracy > slow.val_accuracy, "{fast:?} {slow:?}");
    assert_eq!(
        s.best("d").unwrap().name,
        "reader-lr0.01",
        "chosen on validation"
    );
}

#[test]
fn bad_data_is_refused_naming_the_file_and_the_record() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::write(d.join("ragged.csv"), "a,b,y\n1,2,0\n3,1\n").unwrap();
    let e = refused(
        d,
        r#"source = { csv = "ragged.csv", label = "y" }
test = 0.5"#,
    );
    assert!(e.contains("ragged.csv") && e.contains("line 3"), "{e}");
    std::fs::write(d.join("word.csv"), "a,b,y\n1,2,0\n3,x,1\n").unwrap();
    let e = refused(
        d,
        r#"source = { csv = "word.csv", label = "y" }
test = 0.5"#,
    );
    assert!(
        e.contains("word.csv") && e.contains("line 3") && e.contains("\"x\""),
        "{e}"
    );
    // a test label the training file never had
    std::fs::write(d.join("train.tsv"), "pos\tgood\nneg\tbad\n").unwrap();
    std::fs::write(d.join("test.tsv"), "pos\tfine\nmaybe\tso so\n").unwrap();
    let e = refused(
        d,
        r#"source = { text = { train = "train.tsv", test = "test.tsv" } }"#,
    );
    assert!(
        e.contains("test.tsv") && e.contains("line 2") && e.contains("maybe"),
        "{e}"
    );
    // a line without a tab
    std::fs::write(d.join("notab.tsv"), "pos\tgood\njust words\n").unwrap();
    let e = refused(
        d,
        r#"source = { text = "notab.tsv" }
test = 0.5"#,
    );
    assert!(e.contains("notab.tsv") && e.contains("line 2"), "{e}");
    // an empty class folder, and a truncated image
    let photos = d.join("photos");
    std::fs::create_dir_all(photos.join("a")).unwrap();
    std::fs::create_dir_all(photos.join("b")).unwrap();
    picture(0, &mut Rng::new(1))
        .save(photos.join("a/1.png"))
        .unwrap();
    let e = refused(
        d,
        r#"source = { images = "photos" }
test = 0.5"#,
    );
    assert!(e.contains("photos/b") && e.contains("holds no .png"), "{e}");
    let png = std::fs::read(photos.join("a/1.png")).unwrap();
    std::fs::write(photos.join("b/2.png"), &png[..png.len() / 2]).unwrap();
    picture(0, &mut Rng::new(2))
        .save(photos.join("b/3.png"))
        .unwrap();
    // found before training, whichever split the broken file falls in
    let e = refused(
        d,
        r#"source = { images = "photos" }
test = 0.3"#,
    );
    assert!(e.contains("2.png") && e.contains("truncated"), "{e}");
    assert!(
        !d.join("runs/bad/mlp/checkpoints").exists(),
        "no member trained"
    );
    // a val fraction outside (0, 1) is a config error naming the key
    let bad = format!("[data.d]\nsource = {{ csv = \"word.csv\" }}\nval = 1.5\n{MLP}");
    let e = Config::parse(&bad, "v.toml").unwrap_err().to_string();
    assert!(e.contains("key \"val\"") && e.contains("1.5"), "{e}");
    // augmentation of something that is not an image
    std::fs::write(d.join("ok.csv"), "a,b,y\n1,2,0\n3,1,1\n2,2,0\n1,1,1\n").unwrap();
    let e = refused(
        d,
        r#"source = { csv = "ok.csv" }
test = 0.5
augment = { flip = true }"#,
    );
    assert!(e.contains("augment") && e.contains("[2]"), "{e}");
}

#[test]
fn validation_every_n_steps_reaches_the_metrics_and_tensorboard() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let text = format!(
        "[run]\nname = \"every\"\ndir = \"{}/runs\"\ndevice = \"cpu\"\nwarmup = false\neval_every = 10\n\n\
         [data.d]\nsource = {{ synthetic = {{ train = 640, test = 64, classes = 3, shape = [8] }} }}\nval = 0.1\n{MLP}",
        d.display()
    );
    let run = train(written(d, "every", &text), RunOptions::default()).unwrap();
    let member = run.run_dir.join("mlp");
    let records = std::fs::read_to_string(member.join("metrics.jsonl")).unwrap();
    let val_steps: Vec<u64> = records
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["val"].is_object())
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    // 576 training examples at batch 16: 36 steps, scored at 10, 20, 30 and at the end (with the test split)
    assert_eq!(val_steps, [10, 20, 30, 36], "{records}");
    let last: serde_json::Value = serde_json::from_str(records.lines().last().unwrap()).unwrap();
    assert!(last["test"]["accuracy"].as_f64().is_some(), "{last}");
    let events = std::fs::read_dir(&member)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("tfevents"))
        .unwrap();
    let bytes = std::fs::read(events).unwrap();
    for tag in ["val/accuracy", "val/loss", "test/accuracy"] {
        assert!(
            bytes.windows(tag.len()).any(|w| w == tag.as_bytes()),
            "{tag} in the event file"
        );
    }
}
