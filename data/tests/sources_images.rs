//! Image sources on files written here: image folders (PNG exactly, JPEG approximately), CIFAR-10 and -100 batches
//! written byte by byte, IDX arrays of 2, 3 and 4 dimensions; and every bad input is an error naming the file.

use std::path::{Path, PathBuf};

use cohort_data::idx::encode_idx;
use cohort_data::source::cifar::{self, CifarKind};
use cohort_data::source::idx::{self as idx_source, IdxLayout, IdxSource};
use cohort_data::source::images::{self, ImageFolderSource, Resize};
use cohort_data::{Error, Examples, IdxArray, IdxData, Task};
use image::{ImageFormat, Rgb, RgbImage};

/// An RGB image whose left half (class 0) or right half (class 1) is bright; the red channel also carries `tag`,
/// and green the row, so planes and positions can be told apart.
fn pattern(w: u32, h: u32, class: u32, tag: u8) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let bright = (x < w / 2) == (class == 0);
        let b = if bright { 250 } else { 10 };
        Rgb([tag, (y * 4) as u8, b])
    })
}

fn save(img: &RgbImage, path: &Path, format: ImageFormat) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    img.save_with_format(path, format).unwrap();
}

/// `root/zero/*.png`, `root/one/*.png` (3 and 2 images of 8x6) and a file that is not an image.
fn png_folder(root: &Path) {
    for i in 0..3 {
        save(
            &pattern(8, 6, 0, i),
            &root.join(format!("zero/{i}.png")),
            ImageFormat::Png,
        );
    }
    for i in 0..2 {
        save(
            &pattern(8, 6, 1, 100 + i),
            &root.join(format!("one/{i}.PNG")),
            ImageFormat::Png,
        );
    }
    std::fs::write(root.join("zero/notes.txt"), "not an image").unwrap();
}

fn class_names(ex: &dyn Examples) -> Vec<String> {
    match ex.task() {
        Task::Classify { classes } => classes.clone(),
        other => panic!("expected classes, got {other:?}"),
    }
}

fn f32s(a: &cohort_data::Array) -> &[f32] {
    a.as_f32().expect("f32 features")
}

fn label(a: &cohort_data::Array) -> i32 {
    a.as_i32().expect("i32 label")[0]
}

#[test]
fn png_folder_lists_classes_and_decodes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    png_folder(dir.path());
    let f = images::open(dir.path(), &ImageFolderSource::default(), None).unwrap();
    assert_eq!(class_names(&f), ["one", "zero"]);
    assert_eq!(f.len(), 5, "notes.txt is ignored, .PNG counts");
    assert_eq!(f.shape(), &[3, 6, 8]);
    assert_eq!(f.labels().unwrap(), &[0, 0, 1, 1, 1]);
    assert!(f.describe().contains("2 classes"), "{}", f.describe());
    // example 2 is zero/0.png: tag 0 in red, row*4 in green, the left half bright in blue
    let (x, y) = f.example(2).unwrap();
    assert_eq!(label(&y), 1);
    assert_eq!(x.shape(), &[3, 6, 8]);
    let want = pattern(8, 6, 0, 0);
    let v = f32s(&x);
    for (px, py, p) in want.enumerate_pixels() {
        for c in 0..3 {
            let got = v[(c * 6 + py as usize) * 8 + px as usize];
            assert_eq!(got, f32::from(p[c]) / 255.0, "channel {c} at ({px}, {py})");
        }
    }
    // example 0 is one/0.PNG: tag 100, right half bright
    let (x, y) = f.example(0).unwrap();
    assert_eq!(label(&y), 0);
    let v = f32s(&x);
    assert_eq!(v[0], 100.0 / 255.0);
    let blue = &v[2 * 48..3 * 48];
    assert!(blue[0] < 0.1 && blue[7] > 0.9, "{blue:?}");
}

#[test]
fn grey_and_resize_shapes() {
    let dir = tempfile::tempdir().unwrap();
    png_folder(dir.path());
    let grey = images::open(
        dir.path(),
        &ImageFolderSource {
            channels: 1,
            ..ImageFolderSource::default()
        },
        None,
    )
    .unwrap();
    let (x, _) = grey.example(3).unwrap();
    assert_eq!(x.shape(), &[1, 6, 8]);
    assert!(f32s(&x).iter().all(|v| (0.0..=1.0).contains(v)));
    for resize in [Resize::Stretch, Resize::Crop] {
        let f = images::open(
            dir.path(),
            &ImageFolderSource {
                size: Some([4, 3]),
                resize,
                channels: 3,
            },
            None,
        )
        .unwrap();
        assert_eq!(f.shape(), &[3, 4, 3]);
        let (x, _) = f.example(4).unwrap();
        assert_eq!(x.shape(), &[3, 4, 3]);
        let red = &f32s(&x)[..12];
        // the red channel is constant (the tag 2) in zero/2.png: any resize keeps it
        assert!(
            red.iter().all(|&v| (v - 2.0 / 255.0).abs() < 1e-6),
            "{resize:?}: {red:?}"
        );
        // green grows with the row
        let green = &f32s(&x)[12..24];
        assert!(green[0] < green[9], "{resize:?}: {green:?}");
    }
    // Crop of an 8x6 image to 2x2 keeps the middle 6x6: its left half (columns 1..4) is bright in blue
    let f = images::open(
        dir.path(),
        &ImageFolderSource {
            size: Some([2, 2]),
            resize: Resize::Crop,
            channels: 3,
        },
        None,
    )
    .unwrap();
    let (x, _) = f.example(2).unwrap();
    let blue = &f32s(&x)[8..12];
    assert!(
        blue[0] > 0.75 && blue[1] < 0.25 && blue[2] > 0.75,
        "left bright, right dark: {blue:?}"
    );
}

#[test]
fn jpeg_folder_keeps_the_pattern_and_the_training_classes() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train");
    let test = dir.path().join("test");
    for (c, name) in ["left", "right"].iter().enumerate() {
        for i in 0..2u8 {
            let ext = if i == 0 { "jpg" } else { "JPEG" };
            let img = pattern(16, 16, c as u32, 128);
            save(
                &img,
                &train.join(format!("{name}/{i}.{ext}")),
                ImageFormat::Jpeg,
            );
        }
    }
    save(
        &pattern(16, 16, 1, 128),
        &test.join("right/a.jpg"),
        ImageFormat::Jpeg,
    );
    let opts = ImageFolderSource::default();
    let tr = images::open(&train, &opts, None).unwrap();
    assert_eq!(class_names(&tr), ["left", "right"]);
    for i in 0..tr.len() {
        let (x, y) = tr.example(i).unwrap();
        let blue = &f32s(&x)[2 * 256..];
        let left: f32 = (0..16).map(|r| blue[r * 16 + 2]).sum::<f32>() / 16.0;
        let right: f32 = (0..16).map(|r| blue[r * 16 + 13]).sum::<f32>() / 16.0;
        if label(&y) == 0 {
            assert!(left > 0.8 && right < 0.2, "{i}: {left} {right}");
        } else {
            assert!(left < 0.2 && right > 0.8, "{i}: {left} {right}");
        }
        let red = f32s(&x)[..256].iter().sum::<f32>() / 256.0;
        assert!((red - 128.0 / 255.0).abs() < 0.05, "red {red}");
    }
    // the test folder has only `right`: its id is the training folder's, 1
    let te = images::open(&test, &opts, Some(tr.classes())).unwrap();
    assert_eq!(class_names(&te), ["left", "right"]);
    assert_eq!(te.labels().unwrap(), &[1]);
    assert_eq!(label(&te.example(0).unwrap().1), 1);
}

fn err_text(e: Error) -> String {
    let s = e.to_string();
    assert!(!s.is_empty());
    s
}

#[test]
fn bad_image_folders_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ImageFolderSource::default();
    // no class folders
    let flat = dir.path().join("flat");
    save(&pattern(4, 4, 0, 0), &flat.join("a.png"), ImageFormat::Png);
    let e = err_text(images::open(&flat, &opts, None).unwrap_err());
    assert!(
        e.contains("flat") && e.contains("no class folders") && e.contains("1 images"),
        "{e}"
    );
    // an empty class folder
    let root = dir.path().join("empty");
    png_folder(&root);
    std::fs::create_dir_all(root.join("two")).unwrap();
    std::fs::write(root.join("two/readme.md"), "x").unwrap();
    let e = err_text(images::open(&root, &opts, None).unwrap_err());
    assert!(e.contains("two") && e.contains("no .png"), "{e}");
    // a class that training did not have
    let root = dir.path().join("extra");
    png_folder(&root);
    let e = err_text(images::open(&root, &opts, Some(&["zero".to_string()])).unwrap_err());
    assert!(
        e.contains("`one`") && e.contains("not one of the 1 training classes (zero)"),
        "{e}"
    );
    // bad options
    let e = images::open(
        &root,
        &ImageFolderSource {
            channels: 2,
            ..opts.clone()
        },
        None,
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    // a missing root
    let e = images::open(&dir.path().join("nope"), &opts, None).unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("nope"),
        "{e}"
    );
}

#[test]
fn broken_and_odd_sized_images_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    png_folder(root);
    // a truncated PNG and a truncated JPEG
    let png = std::fs::read(root.join("zero/1.png")).unwrap();
    std::fs::write(root.join("zero/1.png"), &png[..png.len() / 2]).unwrap();
    save(
        &pattern(8, 6, 0, 0),
        &root.join("zero/3.jpg"),
        ImageFormat::Jpeg,
    );
    let jpg = std::fs::read(root.join("zero/3.jpg")).unwrap();
    std::fs::write(root.join("zero/3.jpg"), &jpg[..jpg.len() / 3]).unwrap();
    // text under an image name; an image of another size
    std::fs::write(root.join("zero/4.png"), "hello").unwrap();
    save(
        &pattern(5, 5, 0, 0),
        &root.join("zero/5.png"),
        ImageFormat::Png,
    );
    let f = images::open(root, &ImageFolderSource::default(), None).unwrap();
    let names: Vec<String> = (0..f.len())
        .map(|i| {
            f.path(i)
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let at = |n: &str| names.iter().position(|x| x == n).unwrap();
    let e = err_text(f.example(at("1.png")).unwrap_err());
    assert!(e.contains("1.png") && e.contains("cannot decode"), "{e}");
    let e = err_text(f.example(at("3.jpg")).unwrap_err());
    assert!(e.contains("3.jpg") && e.contains("truncated"), "{e}");
    let e = err_text(f.example(at("4.png")).unwrap_err());
    assert!(
        e.contains("4.png") && e.contains("not a PNG or JPEG"),
        "{e}"
    );
    let e = err_text(f.example(at("5.png")).unwrap_err());
    assert!(
        e.contains("5.png") && e.contains("5x5") && e.contains("8x6") && e.contains("0.PNG"),
        "{e}"
    );
    // with a size, the odd one is resized instead
    let f = images::open(
        root,
        &ImageFolderSource {
            size: Some([6, 8]),
            ..ImageFolderSource::default()
        },
        None,
    )
    .unwrap();
    assert_eq!(f.example(at("5.png")).unwrap().0.shape(), &[3, 6, 8]);
}

/// A CIFAR record: label byte(s), then the R, G, B planes filled with r, g, b (pixel 0 of each plane marked).
fn record(labels: &[u8], rgb: [u8; 3]) -> Vec<u8> {
    let mut r = labels.to_vec();
    for (c, v) in rgb.iter().enumerate() {
        let mut plane = vec![*v; 1024];
        plane[0] = c as u8 + 1;
        r.extend(plane);
    }
    r
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn cifar10_batches_read_labels_and_plane_order() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("cifar-10-batches-bin");
    for b in 1..=5u8 {
        let mut bytes = record(&[b], [10, 20, 30]);
        bytes.extend(record(&[9], [200, 100, 50]));
        write(&bin, &format!("data_batch_{b}.bin"), &bytes);
    }
    write(&bin, "test_batch.bin", &record(&[3], [1, 2, 3]));
    let names = "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n";
    write(&bin, "batches.meta.txt", names.as_bytes());
    let files = cifar::split_files(dir.path(), CifarKind::Cifar10, true).unwrap();
    assert_eq!(files.len(), 5);
    assert!(files[4].ends_with("cifar-10-batches-bin/data_batch_5.bin"));
    let c = cifar::open(&files, CifarKind::Cifar10).unwrap();
    assert_eq!(c.len(), 10);
    assert_eq!(c.shape(), &[3, 32, 32]);
    assert_eq!(c.labels().unwrap(), &[1, 9, 2, 9, 3, 9, 4, 9, 5, 9]);
    assert_eq!(class_names(&c)[9], "truck");
    assert_eq!(c.coarse_labels(), None);
    let (x, y) = c.example(3).unwrap();
    assert_eq!(label(&y), 9);
    let v = f32s(&x);
    assert_eq!(
        [v[0], v[1], v[1024], v[1025], v[2048], v[2049], v[3071]],
        [1.0, 200.0, 2.0, 100.0, 3.0, 50.0, 50.0].map(|p| p / 255.0)
    );
    let test = cifar::split_files(&bin, CifarKind::Cifar10, false).unwrap();
    let t = cifar::open(&test, CifarKind::Cifar10).unwrap();
    assert_eq!(t.labels().unwrap(), &[3]);
    assert!(t.example(1).is_err());
}

#[test]
fn cifar100_uses_the_fine_label() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = record(&[19, 99], [7, 8, 9]);
    bytes.extend(record(&[0, 42], [0, 0, 0]));
    let p = write(dir.path(), "train.bin", &bytes);
    assert_eq!(
        cifar::split_files(dir.path(), CifarKind::Cifar100, true).unwrap(),
        vec![p.clone()]
    );
    let c = cifar::open(&[p], CifarKind::Cifar100).unwrap();
    assert_eq!(c.labels().unwrap(), &[99, 42]);
    assert_eq!(c.coarse_labels().unwrap(), &[19, 0]);
    let classes = class_names(&c);
    assert_eq!((classes.len(), classes[42].as_str()), (100, "42"));
    let (x, _) = c.example(0).unwrap();
    let v = f32s(&x);
    assert_eq!([v[1], v[1025], v[2049]], [7.0, 8.0, 9.0].map(|p| p / 255.0));
}

#[test]
fn bad_cifar_files_name_the_file_and_record() {
    let dir = tempfile::tempdir().unwrap();
    // the python version: a pickle
    let p = write(dir.path(), "data_batch_1", &[0x80, 0x02, 0x7d, 0x71, 0x00]);
    let e = err_text(cifar::open(&[p], CifarKind::Cifar10).unwrap_err());
    assert!(
        e.contains("data_batch_1")
            && e.contains("5 bytes")
            && e.contains("3073")
            && e.contains("pickle"),
        "{e}"
    );
    // a CIFAR-100 file opened as CIFAR-10
    let p = write(dir.path(), "train.bin", &record(&[1, 2], [0; 3]));
    let e = err_text(cifar::open(&[p], CifarKind::Cifar10).unwrap_err());
    assert!(e.contains("3074 bytes") && e.contains("CIFAR-100"), "{e}");
    // a label out of range, in the second record
    let mut bytes = record(&[1], [0; 3]);
    bytes.extend(record(&[10], [0; 3]));
    let p = write(dir.path(), "bad_label.bin", &bytes);
    let e = err_text(cifar::open(&[p], CifarKind::Cifar10).unwrap_err());
    assert!(
        e.contains("bad_label.bin") && e.contains("record 1") && e.contains("label 10"),
        "{e}"
    );
    let mut bytes = record(&[20, 5], [0; 3]);
    bytes.truncate(3074);
    let p = write(dir.path(), "coarse.bin", &bytes);
    let e = err_text(cifar::open(&[p], CifarKind::Cifar100).unwrap_err());
    assert!(
        e.contains("record 0") && e.contains("coarse label 20"),
        "{e}"
    );
    // missing files: every name looked for
    let e = err_text(cifar::split_files(dir.path(), CifarKind::Cifar10, false).unwrap_err());
    assert!(
        e.contains("test_batch.bin") && e.contains("cifar-10-batches-bin"),
        "{e}"
    );
    let e = err_text(cifar::split_files(dir.path(), CifarKind::Cifar100, false).unwrap_err());
    assert!(
        e.contains("test.bin") && e.contains("cifar-100-binary"),
        "{e}"
    );
}

fn idx(dir: &Path, name: &str, dims: &[usize], data: IdxData) -> PathBuf {
    write(
        dir,
        name,
        &encode_idx(&IdxArray {
            dims: dims.to_vec(),
            data,
        }),
    )
}

#[test]
fn idx_arrays_of_three_four_and_two_dimensions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 3-D bytes: [2, 2, 3] -> [1, 2, 3], scaled by 1/255
    let imgs = idx(
        d,
        "train-images-idx3-ubyte",
        &[2, 2, 3],
        IdxData::U8((0..12).collect()),
    );
    let labs = idx(d, "train-labels-idx1-ubyte", &[2], IdxData::U8(vec![4, 1]));
    assert_eq!(
        idx_source::split_files(d, true).unwrap(),
        (imgs.clone(), labs.clone())
    );
    let ex = idx_source::open(&imgs, &labs, &IdxSource::default()).unwrap();
    assert_eq!(ex.shape(), &[1, 2, 3]);
    assert_eq!(
        class_names(&ex),
        ["0", "1", "2", "3", "4"],
        "classes 0..=max, not 10"
    );
    let (x, y) = ex.example(1).unwrap();
    assert_eq!(label(&y), 1);
    assert_eq!(
        f32s(&x),
        (6..12).map(|v| v as f32 / 255.0).collect::<Vec<_>>()
    );

    // 4-D HWC floats: [1, 2, 2, 3] -> [3, 2, 2]: pixel p channel c holds 10 p + c
    let px: Vec<f32> = (0..4)
        .flat_map(|p| (0..3).map(move |c| (10 * p + c) as f32))
        .collect();
    let imgs = idx(d, "t10k-images-idx4-ubyte", &[1, 2, 2, 3], IdxData::F32(px));
    let labs = idx(d, "t10k-labels-idx1-ubyte", &[1], IdxData::I32(vec![0]));
    assert_eq!(idx_source::split_files(d, false).unwrap().0, imgs);
    let hwc = IdxSource {
        layout: IdxLayout::Hwc,
    };
    let ex = idx_source::open(&imgs, &labs, &hwc).unwrap();
    assert_eq!(ex.shape(), &[3, 2, 2]);
    let (x, _) = ex.example(0).unwrap();
    assert_eq!(
        f32s(&x),
        &[
            0.0, 10.0, 20.0, 30.0, 1.0, 11.0, 21.0, 31.0, 2.0, 12.0, 22.0, 32.0
        ]
    );
    // the same file as CHW keeps its order
    let chw = idx_source::open(&imgs, &labs, &IdxSource::default()).unwrap();
    assert_eq!(chw.shape(), &[2, 2, 3]);
    assert_eq!(f32s(&chw.example(0).unwrap().0)[..4], [0.0, 1.0, 2.0, 10.0]);

    // 2-D i16 features: [3, 2] -> [2], values as they are
    let feats = idx(
        d,
        "f.idx",
        &[3, 2],
        IdxData::I16(vec![-5, 5, 300, -300, 0, 1]),
    );
    let labs = idx(d, "l.idx", &[3], IdxData::I8(vec![0, 0, 2]));
    let ex = idx_source::open(&feats, &labs, &IdxSource::default()).unwrap();
    assert_eq!(ex.shape(), &[2]);
    assert_eq!(f32s(&ex.example(1).unwrap().0), &[300.0, -300.0]);
    assert_eq!(ex.task().outputs(), 3);
    assert!(ex.example(3).is_err());
}

#[test]
fn bad_idx_inputs_name_files_and_records() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let imgs = idx(d, "imgs", &[3, 2, 2], IdxData::U8(vec![0; 12]));
    let two = idx(d, "two_labels", &[2], IdxData::U8(vec![0, 1]));
    let e = err_text(idx_source::open(&imgs, &two, &IdxSource::default()).unwrap_err());
    assert!(
        e.contains("imgs")
            && e.contains("3 examples")
            && e.contains("two_labels")
            && e.contains("2 labels"),
        "{e}"
    );
    let flat = idx(d, "labels_2d", &[3, 1], IdxData::U8(vec![0; 3]));
    let e = err_text(idx_source::open(&imgs, &flat, &IdxSource::default()).unwrap_err());
    assert!(e.contains("labels_2d") && e.contains("1-D"), "{e}");
    let neg = idx(d, "neg", &[3], IdxData::I32(vec![0, 2, -1]));
    let e = err_text(idx_source::open(&imgs, &neg, &IdxSource::default()).unwrap_err());
    assert!(
        e.contains("neg") && e.contains("record 2") && e.contains("-1"),
        "{e}"
    );
    let float = idx(d, "float", &[3], IdxData::F32(vec![0.0; 3]));
    let e = err_text(idx_source::open(&imgs, &float, &IdxSource::default()).unwrap_err());
    assert!(e.contains("float") && e.contains("integer"), "{e}");
    let e = err_text(idx_source::split_files(d, true).unwrap_err());
    assert!(
        e.contains("train-images-idx3-ubyte") && e.contains("train-labels-idx1-ubyte"),
        "{e}"
    );
}
