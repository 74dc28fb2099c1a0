//! Property tests of the adapters.

use cohort_data::{Dataset, Position};
use proptest::prelude::*;

fn run<T: Send + 'static>(ds: &Dataset<T>) -> Vec<T> {
    ds.iter().map(|r| r.unwrap()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn shuffle_is_a_permutation(n in 0i64..300, buffer in 1usize..400, seed: u64) {
        let mut v = run(&Dataset::range(0, n).shuffle(buffer, seed));
        v.sort_unstable();
        prop_assert_eq!(v, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn batch_sizes_and_counts(n in 0i64..200, b in 1usize..40, drop in any::<bool>()) {
        let ds = Dataset::range(0, n).batch(b, drop);
        let batches = run(&ds);
        let n = n as usize;
        let want = if drop { n / b } else { n.div_ceil(b) };
        prop_assert_eq!(batches.len(), want);
        prop_assert_eq!(ds.cardinality(), cohort_data::Cardinality::Finite(want as u64));
        for (i, batch) in batches.iter().enumerate() {
            let full = i + 1 < batches.len() || drop || n % b == 0;
            prop_assert_eq!(batch.len(), if full { b } else { n % b });
        }
        let flat: Vec<i64> = batches.concat();
        prop_assert_eq!(flat.len(), if drop { n / b * b } else { n });
    }

    #[test]
    fn repeat_multiplies(n in 0i64..50, r in 0u64..6) {
        let v = run(&Dataset::range(0, n).repeat(Some(r)));
        prop_assert_eq!(v.len() as u64, n as u64 * r);
        for (i, x) in v.iter().enumerate() {
            prop_assert_eq!(*x, i as i64 % n.max(1));
        }
    }

    #[test]
    fn skip_take_match_slices(n in 0i64..100, s in 0u64..120, t in 0u64..120) {
        let v = run(&Dataset::range(0, n).skip(s).take(t));
        let want: Vec<i64> = (0..n).skip(s as usize).take(t as usize).collect();
        prop_assert_eq!(v, want);
    }

    #[test]
    fn resume_gives_the_same_batches(
        n in 1i64..120, b in 1usize..9, buffer in 1usize..64, seed: u64, cut_frac in 0.0f64..1.0, reps in 1u64..3,
    ) {
        let ds = Dataset::range(0, n).shuffle(buffer, seed).map_parallel(2, |x| Ok(x * 10)).batch(b, false)
            .repeat(Some(reps));
        let mut it = ds.iter();
        let e0: Vec<Vec<i64>> = it.by_ref().map(|r| r.unwrap()).collect();
        let e1: Vec<Vec<i64>> = it.by_ref().map(|r| r.unwrap()).collect();
        let cut = (cut_frac * e1.len() as f64) as usize;
        let mut it = ds.iter_from(&Position { fingerprint: ds.fingerprint(), ..Position::new(1, 0) }).unwrap();
        for _ in 0..cut { it.next(); }
        let saved: Position = serde_json::from_str(&serde_json::to_string(&it.pos()).unwrap()).unwrap();
        let rest: Vec<Vec<i64>> = ds.iter_from(&saved).unwrap().map(|r| r.unwrap()).collect();
        prop_assert_eq!(&rest[..], &e1[cut..]);
        prop_assert!(!e0.is_empty());
    }

    #[test]
    fn share_delivers_the_same_sequence(n in 0i64..80, k in 1usize..6, cap in 1usize..4, seed: u64) {
        let ds = Dataset::range(0, n).shuffle(16, seed).batch(3, false);
        let reference = run(&ds);
        let cs = ds.share_with(cohort_data::ShareOptions { capacity: cap, epochs: Some(1), ..cohort_data::ShareOptions::new(k) }).unwrap();
        let hs: Vec<_> = cs.into_iter().map(|mut c| std::thread::spawn(move || {
            c.by_ref().map(|b| b.unwrap().to_vec()).collect::<Vec<_>>()
        })).collect();
        for h in hs {
            prop_assert_eq!(&h.join().unwrap(), &reference);
        }
    }
}
