//! The pipeline's adapters: order, counts, determinism, resumption, failures.

use std::time::Duration;

use cohort_data::{Array, Cardinality, Dataset, Error, Position, Result};

fn epoch<T: Send + 'static>(it: &mut cohort_data::Iter<T>) -> Vec<T> {
    it.by_ref().map(|r| r.unwrap()).collect()
}

fn all<T: Send + 'static>(ds: &Dataset<T>) -> Vec<T> {
    epoch(&mut ds.iter())
}

#[test]
fn range_take_skip_and_cardinality() {
    let ds = Dataset::range(0, 10);
    assert_eq!(all(&ds), (0..10).collect::<Vec<_>>());
    assert_eq!(all(&ds.skip(3).take(4)), vec![3, 4, 5, 6]);
    assert_eq!(ds.skip(3).take(4).cardinality(), Cardinality::Finite(4));
    assert_eq!(ds.skip(20).cardinality(), Cardinality::Finite(0));
    assert!(all(&ds.skip(20)).is_empty());
    assert_eq!(ds.repeat(None).cardinality(), Cardinality::Infinite);
    assert_eq!(
        ds.filter(|x| Ok(*x > 2)).cardinality(),
        Cardinality::Unknown
    );
}

#[test]
fn iterator_runs_one_epoch_per_pass_and_counts_epochs() {
    let ds = Dataset::range(0, 5).shuffle(5, 1);
    let mut it = ds.iter();
    let e0 = epoch(&mut it);
    assert_eq!(it.pos().epoch, 1);
    let e1 = epoch(&mut it);
    assert_eq!(
        it.pos(),
        Position {
            epoch: 2,
            index: 0,
            rng: Position::epoch_key(2),
            fingerprint: ds.fingerprint()
        }
    );
    let mut s0 = e0.clone();
    s0.sort();
    assert_eq!(s0, vec![0, 1, 2, 3, 4]);
    assert_ne!(e0, e1, "each epoch reshuffles");
    // a second iterator is independent and sees the same epochs
    let mut other = ds.iter();
    assert_eq!(epoch(&mut other), e0);
}

#[test]
fn map_and_parallel_map_keep_order() {
    let ds = Dataset::range(0, 200);
    let seq = all(&ds.map(|x| Ok(x * 3)));
    let par = all(&ds.map_parallel(4, |x| {
        // uneven work so that workers finish out of order
        if x % 7 == 0 {
            std::thread::sleep(Duration::from_micros(300));
        }
        Ok(x * 3)
    }));
    assert_eq!(seq, (0..200).map(|x| x * 3).collect::<Vec<_>>());
    assert_eq!(par, seq);
}

#[test]
fn failing_map_surfaces_error_after_the_elements_before_it() {
    for workers in [1, 3] {
        let ds = Dataset::range(0, 100).map_parallel(workers, |x| {
            if x == 42 {
                Err(Error::msg("bad record"))
            } else {
                Ok(x)
            }
        });
        let mut it = ds.iter();
        let got: Vec<Result<i64>> = it.by_ref().collect();
        assert_eq!(got.len(), 43, "42 good elements then the error");
        match &got[42] {
            Err(Error::Map { index: 42, source }) => {
                assert!(source.to_string().contains("bad record"))
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(it.failed());
        assert!(it.next().is_none());
    }
}

#[test]
fn panicking_map_is_an_error_not_a_crash() {
    for workers in [1, 4] {
        let ds = Dataset::range(0, 50)
            .map_parallel(workers, |x| {
                assert!(x != 10, "boom at ten");
                Ok(x)
            })
            .prefetch(2);
        let errs: Vec<Error> = ds.iter().filter_map(|r| r.err()).collect();
        assert_eq!(errs.len(), 1);
        assert!(
            matches!(&errs[0], Error::Panicked { index: 10, message, .. } if message.contains("boom"))
        );
    }
}

#[test]
fn filter_keeps_matching() {
    let ds = Dataset::range(0, 20).filter(|x| Ok(x % 3 == 0));
    assert_eq!(all(&ds), vec![0, 3, 6, 9, 12, 15, 18]);
    let bad = Dataset::range(0, 5).filter(|_| Err(Error::msg("no")));
    assert!(bad.iter().next().unwrap().is_err());
}

#[test]
fn batch_and_padded_batch() {
    let ds = Dataset::range(0, 10);
    let b: Vec<Vec<i64>> = all(&ds.batch(4, false));
    assert_eq!(b, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    assert_eq!(all(&ds.batch(4, true)).len(), 2);
    assert_eq!(ds.batch(4, false).cardinality(), Cardinality::Finite(3));
    assert_eq!(ds.batch(4, true).cardinality(), Cardinality::Finite(2));

    let seqs = vec![
        Array::from_i32(vec![1, 2, 3], &[3]).unwrap(),
        Array::from_i32(vec![4], &[1]).unwrap(),
        Array::from_i32(vec![5, 6], &[2]).unwrap(),
    ];
    let labels = vec![
        Array::scalar_i32(0),
        Array::scalar_i32(1),
        Array::scalar_i32(0),
    ];
    let ds = Dataset::from_vec(seqs).zip(&Dataset::from_vec(labels));
    let batches = all(&ds.padded_batch(2, 0.0, false));
    assert_eq!(batches[0].0.shape(), &[2, 3]);
    assert_eq!(batches[0].0.as_i32().unwrap(), &[1, 2, 3, 4, 0, 0]);
    assert_eq!(batches[0].1.as_i32().unwrap(), &[0, 1]);
    assert_eq!(batches[1].0.shape(), &[1, 2]);
    // unpadded batching of different lengths is a clear error
    let e = Dataset::from_vec(vec![
        Array::from_i32(vec![1, 2], &[2]).unwrap(),
        Array::from_i32(vec![1], &[1]).unwrap(),
    ])
    .batch(2, false)
    .iter()
    .next()
    .unwrap()
    .unwrap_err();
    assert!(e.to_string().contains("padded_batch"), "{e}");
}

#[test]
fn from_tensor_slices_of_arrays() {
    let x = Array::from_f32((0..12).map(|v| v as f32).collect(), &[4, 3]).unwrap();
    let y = Array::from_i32(vec![0, 1, 2, 3], &[4]).unwrap();
    let ds = Dataset::from_tensor_slices((x.clone(), y));
    let items = all(&ds);
    assert_eq!(items.len(), 4);
    assert_eq!(items[2].0.as_f32().unwrap(), &[6.0, 7.0, 8.0]);
    assert_eq!(items[2].1.shape(), &[] as &[usize]);
    let (bx, by) = all(&ds.batch(4, false)).remove(0);
    assert_eq!(bx, x);
    assert_eq!(by.as_i32().unwrap(), &[0, 1, 2, 3]);
}

#[test]
fn repeat_counts_and_reshuffles_each_pass() {
    let ds = Dataset::range(0, 4);
    assert_eq!(all(&ds.repeat(Some(3))).len(), 12);
    assert_eq!(all(&ds.repeat(None).take(10)).len(), 10);
    assert!(
        all(&Dataset::range(0, 0).repeat(None)).is_empty(),
        "no spin on empty"
    );
    let sh = ds.shuffle(4, 9).repeat(Some(2));
    let v = all(&sh);
    assert_ne!(v[..4], v[4..], "second pass draws another order");
    // unknown cardinality upstream still repeats
    assert_eq!(all(&ds.filter(|_| Ok(true)).repeat(Some(2))).len(), 8);
}

#[test]
fn zip_stops_at_the_shorter() {
    let z = Dataset::range(0, 3).zip(&Dataset::range(10, 20));
    assert_eq!(all(&z), vec![(0, 10), (1, 11), (2, 12)]);
    assert_eq!(z.cardinality(), Cardinality::Finite(3));
}

#[test]
fn cache_serves_later_passes_from_memory() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let ds = Dataset::range(0, 10)
        .map(move |x| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(x)
        })
        .cache();
    let mut it = ds.iter();
    let a = epoch(&mut it);
    let b = epoch(&mut it);
    assert_eq!(a, b);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        10,
        "second epoch came from the cache"
    );
    let mut resumed = ds.iter_from(&Position::new(3, 7)).unwrap();
    assert_eq!(epoch(&mut resumed), vec![7, 8, 9]);
}

#[test]
fn prefetch_yields_the_same_and_drops_cleanly() {
    let ds = Dataset::range(0, 1000).map_parallel(2, Ok).prefetch(4);
    assert_eq!(all(&ds), (0..1000).collect::<Vec<_>>());
    // drop mid-epoch: threads are stopped and joined, nothing hangs
    let mut it = ds.prefetch(2).iter();
    assert_eq!(it.next().unwrap().unwrap(), 0);
    drop(it);
}

#[test]
fn resume_mid_epoch_gives_the_same_elements() {
    let ds = Dataset::range(0, 50)
        .shuffle(16, 7)
        .map_parallel(3, |x| Ok(x * 2))
        .filter(|x| Ok(x % 3 != 0))
        .batch(4, false)
        .prefetch(2)
        .repeat(Some(2));
    let mut it = ds.iter();
    let mut reference = Vec::new();
    for _ in 0..3 {
        reference.push(epoch(&mut it));
    }
    // stop at every position of epoch 1, serialize, resume
    for cut in 0..reference[1].len() {
        let mut it = ds.iter();
        epoch(&mut it);
        for _ in 0..cut {
            it.next().unwrap().unwrap();
        }
        let json = serde_json::to_string(&it.pos()).unwrap();
        drop(it);
        let pos: Position = serde_json::from_str(&json).unwrap();
        let mut resumed = ds.iter_from(&pos).unwrap();
        assert_eq!(
            epoch(&mut resumed),
            reference[1][cut..].to_vec(),
            "cut {cut}"
        );
        assert_eq!(epoch(&mut resumed), reference[2]);
    }
}

#[test]
fn resume_rejects_another_pipeline() {
    let a = Dataset::range(0, 10).shuffle(10, 1);
    let b = Dataset::range(0, 10).shuffle(10, 2);
    let pos = a.iter().pos();
    assert!(matches!(b.iter_from(&pos), Err(Error::Position { .. })));
    assert!(
        b.iter_from(&Position::new(0, 3)).is_ok(),
        "fingerprint 0 accepts any"
    );
}

#[test]
fn same_seed_same_order_other_seed_other_order() {
    let a = all(&Dataset::range(0, 100).shuffle(100, 5));
    let b = all(&Dataset::range(0, 100).shuffle(100, 5));
    let c = all(&Dataset::range(0, 100).shuffle(100, 6));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn rebatched_position_continues_the_same_shuffle() {
    let base = Dataset::range(0, 100).shuffle(100, 4);
    let order: Vec<i64> = all(&base);
    let big = base.batch(10, false);
    let mut it = big.iter();
    for _ in 0..3 {
        it.next().unwrap().unwrap();
    }
    let small = base.batch(8, false);
    let pos = it.pos().rebatched(10, 8);
    assert_eq!(pos.index, 3);
    let rest: Vec<i64> = small
        .iter_from(&pos)
        .unwrap()
        .flat_map(|b| b.unwrap())
        .collect();
    // 30 examples seen; the new batches start at example 24 (a whole batch of 8), in the same order
    assert_eq!(rest, order[24..]);
}
