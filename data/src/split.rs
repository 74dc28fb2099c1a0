//! Splits of a data set into index lists: a seeded, stratified held-out fraction (validation or test).
//!
//! A split is drawn once, from the indices of the examples, before any pipeline runs: the held-out examples are
//! never seen in training, and the same seed draws the same split on every run and resume.

use crate::error::{Error, Result};
use crate::rng::{Rng, mix};

/// The indices of `0..n` split into `(kept, held_out)`, `fraction` of them held out, both ascending.
///
/// With `labels` (one class per example) the split is stratified: each class holds out its own share, so that
/// the held-out examples have the class balance of the whole and number `round(n * fraction)`; a class of one
/// example stays in training.
///
/// # Errors
/// When `fraction` is not inside (0, 1), `labels` are not `n` long, or either side would be empty.
pub fn hold_out(
    n: usize,
    labels: Option<&[i32]>,
    fraction: f64,
    seed: u64,
) -> Result<(Vec<usize>, Vec<usize>)> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(Error::InvalidArgument {
            op: "split",
            reason: format!(
                "a held-out fraction of {fraction}: it must lie strictly between 0 and 1, e.g. 0.1"
            ),
        });
    }
    let mut classes: Vec<(i32, Vec<usize>)> = Vec::new();
    match labels {
        Some(l) if l.len() != n => {
            return Err(Error::InvalidArgument {
                op: "split",
                reason: format!("{} labels for {n} examples", l.len()),
            });
        }
        Some(l) => {
            let mut sorted: Vec<usize> = (0..n).collect();
            sorted.sort_by_key(|&i| (l[i], i));
            for i in sorted {
                match classes.last_mut() {
                    Some((c, members)) if *c == l[i] => members.push(i),
                    _ => classes.push((l[i], vec![i])),
                }
            }
        }
        None => classes.push((0, (0..n).collect())),
    }
    // Each class's share rounded down, then the examples left of `round(n * fraction)` to the classes with the
    // largest remainders (Hamilton's method): the held-out total is the fraction asked for, whatever the classes.
    let shares: Vec<f64> = classes
        .iter()
        .map(|(_, m)| m.len() as f64 * fraction)
        .collect();
    let mut take: Vec<usize> = shares.iter().map(|s| s.floor() as usize).collect();
    let short = ((n as f64 * fraction).round() as usize).saturating_sub(take.iter().sum());
    let mut by_remainder: Vec<usize> = (0..classes.len()).collect();
    by_remainder.sort_by(|&a, &b| {
        (shares[b] - shares[b].floor()).total_cmp(&(shares[a] - shares[a].floor()))
    });
    for &c in by_remainder.iter().take(short) {
        take[c] += 1;
    }
    let mut held = Vec::new();
    for ((class, mut members), k) in classes.into_iter().zip(take) {
        let k = k.min(members.len().saturating_sub(1));
        Rng::new(mix(seed, class as u64)).shuffle(&mut members);
        held.extend_from_slice(&members[..k]);
    }
    held.sort_unstable();
    let mut is_held = vec![false; n];
    held.iter().for_each(|&i| is_held[i] = true);
    let kept: Vec<usize> = (0..n).filter(|&i| !is_held[i]).collect();
    if held.is_empty() || kept.is_empty() {
        return Err(Error::InvalidArgument {
            op: "split",
            reason: format!(
                "holding out {fraction} of {n} examples leaves {} to train on and {} held out: \
                 use a fraction nearer 0.5 or more examples",
                kept.len(),
                held.len()
            ),
        });
    }
    Ok((kept, held))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stratified_split_keeps_the_class_balance_and_its_seed() {
        // 900 of class 0, 100 of class 1
        let labels: Vec<i32> = (0..1000).map(|i| i32::from(i % 10 == 3)).collect();
        let (kept, held) = hold_out(1000, Some(&labels), 0.2, 7).unwrap();
        assert_eq!(held.len(), 200);
        assert_eq!(kept.len() + held.len(), 1000);
        assert_eq!(held.iter().filter(|&&i| labels[i] == 1).count(), 20);
        assert!(kept.windows(2).all(|w| w[0] < w[1]));
        assert!(held.iter().all(|i| kept.binary_search(i).is_err()));
        assert_eq!(hold_out(1000, Some(&labels), 0.2, 7).unwrap().1, held);
        assert_ne!(hold_out(1000, Some(&labels), 0.2, 8).unwrap().1, held);
        let (_, plain) = hold_out(1000, None, 0.25, 7).unwrap();
        assert_eq!(plain.len(), 250);
        // three classes of 7: shares of 2.1 each, and round(2.1 * 3) = 6 in all
        let three: Vec<i32> = (0..21).map(|i| i % 3).collect();
        assert_eq!(hold_out(21, Some(&three), 0.3, 1).unwrap().1.len(), 6);
    }

    #[test]
    fn fractions_outside_the_open_interval_are_refused() {
        for f in [0.0, 1.0, -0.1, 1.5, f64::NAN] {
            let e = hold_out(10, None, f, 0).unwrap_err().to_string();
            assert!(e.contains("strictly between 0 and 1"), "{e}");
        }
        let e = hold_out(1, None, 0.5, 0).unwrap_err().to_string();
        assert!(e.contains("leaves 1 to train on and 0 held out"), "{e}");
    }
}
