//! Tensors out of the pipeline: training batches, device prefetch and its transfer seam.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cohort_data::{
    Array, Dataset, DeviceTransfer, Layout, Mnist, MnistConfig, PinnedTransfer, Result, Split,
    Staged, TensorCopy, ToDevice, TrainBatch, bundled_mnist_dir,
};
use cohort_tensor::{DType, Device, Tensor};

fn mnist() -> Arc<Mnist> {
    Arc::new(Mnist::load(bundled_mnist_dir(), Split::Test).unwrap())
}

fn check_mnist_batches(dev: Device) {
    let m = mnist();
    let cfg = MnistConfig {
        batch_size: 256,
        seed: 3,
        ..MnistConfig::default()
    };
    let host: Vec<(Array, Array)> = m.batches(&cfg).iter().map(|b| b.unwrap()).collect();
    let ds = m.train_batches(&cfg, dev);
    let mut n = 0;
    for (i, b) in ds.iter().enumerate() {
        let b = b.unwrap();
        assert_eq!(b.device(), dev);
        assert_eq!(b.inputs.dtype(), DType::F32);
        assert_eq!(b.labels.dtype(), DType::I32);
        assert_eq!(b.inputs.shape()[1], 784);
        assert_eq!(b.len(), host[i].1.shape()[0]);
        assert!(b.inputs.to_vec::<f32>().unwrap() == host[i].0.as_f32().unwrap());
        assert_eq!(
            b.labels.to_vec::<i32>().unwrap(),
            host[i].1.as_i32().unwrap()
        );
        n += b.len();
    }
    assert_eq!(n, 2000);
}

#[test]
fn mnist_train_batches_cpu() {
    check_mnist_batches(Device::Cpu);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mnist_train_batches_cuda() {
    check_mnist_batches(Device::Cuda(0));
}

#[test]
fn image_layout_and_resume() {
    let m = mnist();
    let cfg = MnistConfig {
        batch_size: 100,
        layout: Layout::Image,
        drop_remainder: true,
        ..MnistConfig::default()
    };
    let ds = m.train_batches(&cfg, Device::Cpu);
    let mut it = ds.iter();
    let first = it.next().unwrap().unwrap();
    assert_eq!(first.inputs.shape(), &[100, 1, 28, 28]);
    let pos = it.pos();
    let second = it.next().unwrap().unwrap();
    let resumed = ds.iter_from(&pos).unwrap().next().unwrap().unwrap();
    assert_eq!(
        resumed.labels.to_vec::<i32>().unwrap(),
        second.labels.to_vec::<i32>().unwrap()
    );
    assert_eq!(ds.cardinality(), cohort_data::Cardinality::Finite(20));
}

struct Counting(AtomicUsize);

impl DeviceTransfer<TrainBatch> for Counting {
    fn transfer(&self, item: TrainBatch, device: &Device) -> Result<Staged<TrainBatch>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Staged::done(item.to_device(device)?))
    }
}

#[test]
fn device_prefetch_goes_through_the_transfer_seam() {
    let m = mnist();
    let cfg = MnistConfig {
        batch_size: 500,
        prefetch: 0,
        ..MnistConfig::default()
    };
    let counter = Arc::new(Counting(AtomicUsize::new(0)));
    let ds =
        m.train_batches(&cfg, Device::Cpu)
            .prefetch_to_device_with(counter.clone(), Device::Cpu, 2);
    let plain = m.train_batches(&cfg, Device::Cpu);
    let a: Vec<TrainBatch> = ds.iter().map(|b| b.unwrap()).collect();
    let b: Vec<TrainBatch> = plain.iter().map(|b| b.unwrap()).collect();
    assert_eq!(a.len(), 4);
    assert_eq!(counter.0.load(Ordering::SeqCst), 4);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            x.labels.to_vec::<i32>().unwrap(),
            y.labels.to_vec::<i32>().unwrap()
        );
    }
    // the device does not enter the fingerprint: a position saved on one device resumes on another
    assert_eq!(
        ds.fingerprint(),
        m.train_batches(&cfg, Device::Cpu)
            .prefetch_to_device(Device::Cuda(0), 2)
            .fingerprint()
    );
}

#[test]
fn tensor_slices_batch_back_to_the_tensor() {
    let dev = Device::Cpu;
    let x = Tensor::from_vec(
        (0..24).map(|v| v as f32).collect::<Vec<f32>>(),
        &[6, 4],
        &dev,
    )
    .unwrap();
    let y = Tensor::from_vec(vec![0i32, 1, 2, 3, 4, 5], &[6], &dev).unwrap();
    let ds = Dataset::from_tensor_slices((x.clone(), y))
        .shuffle(6, 1)
        .batch(3, false);
    let batches: Vec<(Tensor, Tensor)> = ds.iter().map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[0].0.shape(), &[3, 4]);
    let mut rows: Vec<i32> = batches
        .iter()
        .flat_map(|b| b.1.to_vec::<i32>().unwrap())
        .collect();
    // each row still carries its label: row r of x starts with 4r
    for (bx, by) in &batches {
        let xs = bx.to_vec::<f32>().unwrap();
        for (k, l) in by.to_vec::<i32>().unwrap().iter().enumerate() {
            assert_eq!(xs[k * 4], (*l * 4) as f32);
        }
    }
    rows.sort_unstable();
    assert_eq!(rows, vec![0, 1, 2, 3, 4, 5]);
}

#[test]
fn arrays_and_tensors_round_trip() {
    let a = Array::from_f32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let t = a.clone().to_tensor(&Device::Cpu).unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(Array::from_tensor(&t).unwrap(), a);
    let bad = TrainBatch::from_arrays(a.clone(), a, &Device::Cpu);
    assert!(bad.is_err(), "float labels are rejected");
}

#[test]
fn shared_train_batches_are_one_copy() {
    let m = mnist();
    let ds = m.train_batches(
        &MnistConfig {
            batch_size: 1000,
            ..MnistConfig::default()
        },
        Device::Cpu,
    );
    let mut cs = ds.share(2).unwrap();
    let a = cs[0].next().unwrap().unwrap();
    let b = cs[1].next().unwrap().unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.inputs.shape(), &[1000, 784]);
}

#[test]
fn synthetic_and_text_sources_make_train_batches() {
    let (x, y) = cohort_data::synthetic::classification(100, 5, 3, 4.0, 9).unwrap();
    let ds = Dataset::from_tensor_slices((x, y))
        .shuffle(100, 2)
        .batch(32, true)
        .to_train_batches(Device::Cpu, 2);
    let batches: Vec<TrainBatch> = ds.iter().map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 3);
    assert_eq!(batches[0].inputs.shape(), &[32, 5]);
    assert_eq!(batches[0].labels.dtype(), DType::I32);

    let vocab = cohort_data::Vocabulary::build(["a b c", "b c"], 1, 10);
    let examples = ["a b c", "c"]
        .iter()
        .zip([1, 0])
        .map(|(t, l)| (vocab.encode(t, 16), cohort_data::Array::scalar_i32(l)))
        .collect::<Vec<_>>();
    let ds = Dataset::from_vec(examples)
        .padded_batch(2, 0.0, false)
        .to_train_batches(Device::Cpu, 0);
    let b = ds.iter().next().unwrap().unwrap();
    assert_eq!(b.inputs.dtype(), DType::I32);
    assert_eq!(b.inputs.shape(), &[2, 3]);
}

type HostBatches = Vec<(Vec<f32>, Vec<i32>)>;

/// Host reference batches and the same pipeline prefetched onto cuda:0 with `transfer`.
fn cuda_pipeline(
    transfer: Arc<dyn DeviceTransfer<TrainBatch>>,
    depth: usize,
) -> (HostBatches, Dataset<TrainBatch>) {
    let m = mnist();
    let cfg = MnistConfig {
        batch_size: 128,
        seed: 11,
        prefetch: 0,
        ..MnistConfig::default()
    };
    let host = m
        .batches(&cfg)
        .iter()
        .map(|b| {
            let (x, y) = b.unwrap();
            (x.as_f32().unwrap().to_vec(), y.as_i32().unwrap().to_vec())
        })
        .collect();
    let ds = m.train_batches(&cfg, Device::Cpu).prefetch_to_device_with(
        transfer,
        Device::Cuda(0),
        depth,
    );
    (host, ds)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pinned_prefetch_batches_arrive_intact_under_load() {
    let dev = Device::Cuda(0);
    let (host, ds) = cuda_pipeline(Arc::new(PinnedTransfer::new(3)), 4);
    let w = Tensor::rand_uniform(&[784, 784], -0.01, 0.01, DType::F32, 5, &dev).unwrap();
    for epoch in 0..2 {
        let mut n = 0;
        for (i, b) in ds.iter().enumerate() {
            let b = b.unwrap();
            assert_eq!(b.device(), dev);
            // queue a lot of compute on the batch first, so the next copies overlap it
            let mut h = b.inputs.clone();
            for _ in 0..20 {
                h = h.matmul(&w).unwrap().relu().unwrap();
            }
            assert!(
                b.inputs.to_vec::<f32>().unwrap() == host[i].0,
                "epoch {epoch} batch {i}: inputs differ from the host pipeline"
            );
            assert_eq!(b.labels.to_vec::<i32>().unwrap(), host[i].1);
            assert_eq!(h.shape(), &[b.len(), 784]);
            n += 1;
        }
        assert_eq!(n, host.len());
    }
    // dropping mid-epoch with copies in flight never hangs
    let mut it = ds.iter();
    it.next().unwrap().unwrap();
    drop(it);
    dev.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pinned_and_plain_transfers_agree_and_share() {
    let (host, pinned) = cuda_pipeline(Arc::new(PinnedTransfer::new(1)), 1);
    let (_, plain) = cuda_pipeline(Arc::new(TensorCopy), 2);
    for (i, (a, b)) in pinned.iter().zip(plain.iter()).enumerate() {
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(a.inputs.to_vec::<f32>().unwrap() == b.inputs.to_vec::<f32>().unwrap());
        assert_eq!(a.labels.to_vec::<i32>().unwrap(), host[i].1);
    }
    let mut cs = pinned.share(2).unwrap();
    for (i, (x, y)) in host.iter().enumerate() {
        let a = cs[0].next().unwrap().unwrap();
        let b = cs[1].next().unwrap().unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.inputs.to_vec::<f32>().unwrap() == *x, "batch {i}");
        assert_eq!(b.labels.to_vec::<i32>().unwrap(), *y);
    }
}
