//! `share(k)`: every consumer sees the same sequence; dropping consumers never hangs; a stress test that always ends.

use std::sync::Arc;
use std::time::Duration;

use cohort_data::{Dataset, Error, Position, Rng, ShareOptions};

/// Run `f` on a thread and fail the test if it does not finish within `limit`.
fn within<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .expect("did not finish in time: a pipeline thread hangs")
}

#[test]
fn every_consumer_sees_every_element_and_epoch() {
    within(Duration::from_secs(30), || {
        let ds = Dataset::range(0, 20).shuffle(20, 3).batch(3, false);
        let reference: Vec<Vec<Vec<i64>>> = {
            let mut it = ds.iter();
            (0..2)
                .map(|_| it.by_ref().map(|b| b.unwrap()).collect())
                .collect()
        };
        let consumers = ds
            .share_with(ShareOptions {
                epochs: Some(2),
                ..ShareOptions::new(3)
            })
            .unwrap();
        let handles: Vec<_> = consumers
            .into_iter()
            .map(|mut c| {
                std::thread::spawn(move || {
                    let mut epochs = Vec::new();
                    for _ in 0..2 {
                        let e: Vec<Arc<Vec<i64>>> = c.by_ref().map(|b| b.unwrap()).collect();
                        epochs.push(e);
                    }
                    assert!(c.next().is_none(), "the producer stops after 2 epochs");
                    epochs
                })
            })
            .collect();
        let got: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for g in &got {
            let plain: Vec<Vec<Vec<i64>>> = g
                .iter()
                .map(|e| e.iter().map(|b| b.as_ref().clone()).collect())
                .collect();
            assert_eq!(plain, reference);
        }
        // shared, not copied: the consumers hold the same allocation
        assert!(Arc::ptr_eq(&got[0][0][0], &got[1][0][0]));
        assert!(Arc::ptr_eq(&got[0][1][2], &got[2][1][2]));
    });
}

#[test]
fn dropping_a_consumer_mid_epoch_does_not_block_the_others() {
    within(Duration::from_secs(30), || {
        let ds = Dataset::range(0, 1000);
        let mut cs = ds
            .share_with(ShareOptions {
                capacity: 1,
                ..ShareOptions::new(2)
            })
            .unwrap();
        let mut slow = cs.pop().unwrap();
        let mut fast = cs.pop().unwrap();
        assert_eq!(*slow.next().unwrap().unwrap(), 0);
        drop(slow);
        let rest: Vec<i64> = fast.by_ref().map(|x| *x.unwrap()).collect();
        assert_eq!(rest.len(), 1000);
        assert_eq!(fast.pos().epoch, 1);
    });
}

#[test]
fn dropping_every_consumer_stops_the_producer() {
    within(Duration::from_secs(30), || {
        let ds = Dataset::range(0, i64::MAX).map_parallel(2, Ok).prefetch(2);
        let mut cs = ds.share(4).unwrap();
        for c in &mut cs {
            c.next().unwrap().unwrap();
        }
        drop(cs); // joins the producer: returns only if it stopped
    });
}

#[test]
fn errors_reach_every_consumer() {
    within(Duration::from_secs(30), || {
        let ds = Dataset::range(0, 10).map(|x| {
            if x == 5 {
                Err(Error::msg("bad"))
            } else {
                Ok(x)
            }
        });
        // queues long enough to hold the whole run: the consumers are read one after the other
        let cs = ds
            .share_with(ShareOptions {
                capacity: 16,
                ..ShareOptions::new(2)
            })
            .unwrap();
        for mut c in cs {
            let v: Vec<_> = c.by_ref().collect();
            assert_eq!(v.len(), 6);
            assert!(v[5].as_ref().is_err_and(|e| e.to_string().contains("bad")));
            assert!(c.next().is_none());
        }
    });
}

#[test]
fn resume_shared_from_a_saved_position() {
    within(Duration::from_secs(30), || {
        let ds = Dataset::range(0, 30).shuffle(30, 11).batch(4, false);
        // first: queues big enough for the whole epoch, so one consumer may run ahead of the other
        let big = ShareOptions {
            capacity: 16,
            ..ShareOptions::new(2)
        };
        let mut cs = ds.share_with(big).unwrap();
        let first: Vec<Vec<i64>> = (0..3)
            .map(|_| cs[0].next().unwrap().unwrap().to_vec())
            .collect();
        for _ in 0..3 {
            cs[1].next().unwrap().unwrap();
        }
        let pos = cs[0].pos();
        assert_eq!(pos, cs[1].pos());
        // read both in lockstep: a consumer left unread would hold the producer back
        let mut expect: Vec<Vec<i64>> = Vec::new();
        while let Some(b) = cs[0].next() {
            expect.push(b.unwrap().to_vec());
            assert_eq!(
                cs[1].next().unwrap().unwrap().to_vec(),
                *expect.last().unwrap()
            );
        }
        drop(cs);
        let mut again = ds.share_with(ShareOptions { start: pos, ..big }).unwrap();
        let got: Vec<Vec<i64>> = again[1].by_ref().map(|b| b.unwrap().to_vec()).collect();
        assert_eq!(got, expect);
        assert_eq!(first.len() + got.len(), 8);
    });
}

#[test]
fn zero_consumers_is_an_error() {
    assert!(Dataset::range(0, 3).share(0).is_err());
}

/// Many consumers at random speeds, some dropped at random points, on several producers at once: every run ends,
/// and every consumer that read to the end saw the full sequence.
#[test]
fn stress_many_consumers_always_ends() {
    within(Duration::from_secs(120), || {
        let mut rng = Rng::new(2024);
        for round in 0..6 {
            let k = 2 + rng.below(14) as usize;
            let capacity = 1 + rng.below(4) as usize;
            let ds = Dataset::range(0, 300)
                .shuffle(64, round)
                .map_parallel(3, |x| Ok(x + 1))
                .batch(5, false)
                .prefetch(2);
            let reference: Vec<Vec<i64>> = ds.iter().map(|b| b.unwrap()).collect();
            let consumers = ds
                .share_with(ShareOptions {
                    capacity,
                    epochs: Some(1),
                    ..ShareOptions::new(k)
                })
                .unwrap();
            let handles: Vec<_> = consumers
                .into_iter()
                .enumerate()
                .map(|(i, mut c)| {
                    let drop_after = if i % 3 == 1 {
                        Some(rng.below(60) as usize)
                    } else {
                        None
                    };
                    let spin = rng.below(3);
                    std::thread::spawn(move || {
                        let mut seen = Vec::new();
                        loop {
                            if drop_after == Some(seen.len()) {
                                return None;
                            }
                            match c.next_timeout(Duration::from_secs(20)) {
                                Ok(Some(b)) => seen.push(b.unwrap().to_vec()),
                                Ok(None) => return Some(seen),
                                Err(_) => panic!("consumer {i} starved for 20 s"),
                            }
                            for _ in 0..spin {
                                std::thread::yield_now();
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                if let Some(seen) = h.join().unwrap() {
                    assert_eq!(seen, reference);
                }
            }
        }
    });
}

#[test]
fn backpressure_holds_the_fastest_at_capacity() {
    within(Duration::from_secs(30), || {
        let ds = Dataset::range(0, 100);
        let mut cs = ds
            .share_with(ShareOptions {
                capacity: 3,
                ..ShareOptions::new(2)
            })
            .unwrap();
        for i in 0..3 {
            assert_eq!(*cs[0].next().unwrap().unwrap(), i);
        }
        // 3 ahead of the idle consumer: the 4th waits
        assert!(cs[0].next_timeout(Duration::from_millis(50)).is_err());
        assert_eq!(*cs[1].next().unwrap().unwrap(), 0);
        assert_eq!(
            *cs[0]
                .next_timeout(Duration::from_secs(5))
                .unwrap()
                .unwrap()
                .unwrap(),
            3
        );
        // once the slow consumer is dropped, the fast one runs free
        cs.truncate(1);
        assert_eq!(cs[0].by_ref().count(), 96);
    });
}

#[test]
fn lockstep_on_one_thread_with_capacity_one() {
    within(Duration::from_secs(30), || {
        let ds = Dataset::range(0, 50).shuffle(50, 1).batch(4, false);
        let reference: Vec<Vec<i64>> = ds.iter().map(|b| b.unwrap()).collect();
        let mut cs = ds
            .share_with(ShareOptions {
                capacity: 1,
                ..ShareOptions::new(3)
            })
            .unwrap();
        for want in &reference {
            for c in &mut cs {
                assert_eq!(&*c.next().unwrap().unwrap(), want);
            }
        }
        for c in &mut cs {
            assert!(c.next().is_none(), "end of epoch");
            assert_eq!(c.pos().epoch, 1);
        }
    });
}

#[test]
fn share_from_continues_the_sequence() {
    within(Duration::from_secs(30), || {
        let ds = Dataset::range(0, 40).shuffle(40, 8);
        let all: Vec<i64> = ds.iter().map(|x| x.unwrap()).collect();
        let pos = Position {
            fingerprint: ds.fingerprint(),
            ..Position::new(0, 15)
        };
        let mut cs = ds.share_from(2, &pos).unwrap();
        let (mut a, mut b) = (cs.remove(0), cs.remove(0));
        let mut got = Vec::new();
        while let (Some(x), Some(y)) = (a.next(), b.next()) {
            let (x, y) = (x.unwrap(), y.unwrap());
            assert!(Arc::ptr_eq(&x, &y));
            got.push(*x);
        }
        assert_eq!(got, all[15..]);
    });
}
