//! A tuner's decisions, one table for the products' (cuBLASLt) and the convolutions' (cuDNN): how each geometry
//! runs, a count of the decisions made (timed, changed or adopted: what changes whenever the saved choices would),
//! and the timings made since the last report.

use std::collections::HashMap;
use std::hash::Hash;

use super::GemmTuning;

/// How each geometry `K` runs (`E`), with the count and the report.
pub(crate) struct Decisions<K, E> {
    entries: HashMap<K, E>,
    made: u64,
    report: Vec<GemmTuning>,
}

impl<K: Eq + Hash, E> Decisions<K, E> {
    pub(crate) fn new() -> Self {
        Decisions {
            entries: HashMap::new(),
            made: 0,
            report: Vec::new(),
        }
    }

    /// Makes `entry` the way `key` runs.
    pub(crate) fn decide(&mut self, key: K, entry: E) {
        self.entries.insert(key, entry);
        self.made += 1;
    }

    /// Adopts saved decisions of `what` (`gemm`, `convolution`) for the keys not decided here yet: each entry that
    /// can run, or the saved decision described where it cannot (warned of: it will be chosen afresh). Returns how
    /// many were adopted.
    pub(crate) fn adopt(
        &mut self,
        what: &str,
        saved: impl IntoIterator<Item = (K, std::result::Result<E, String>)>,
    ) -> usize {
        let mut adopted = 0;
        for (key, entry) in saved {
            if self.contains(&key) {
                continue;
            }
            match entry {
                Ok(e) => {
                    self.decide(key, e);
                    adopted += 1;
                }
                Err(saved) => tracing::warn!(
                    "{what} choices: {saved} cannot run as saved; it will be chosen afresh"
                ),
            }
        }
        adopted
    }

    pub(crate) fn get(&self, key: &K) -> Option<&E> {
        self.entries.get(key)
    }

    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut E> {
        self.entries.get_mut(key)
    }

    pub(crate) fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Takes `key`'s entry out, to be decided again.
    pub(crate) fn remove(&mut self, key: &K) -> Option<E> {
        self.entries.remove(key)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &E)> {
        self.entries.iter()
    }

    /// Drops every entry (before the handle they were made with).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// Decisions made so far.
    pub(crate) fn made(&self) -> u64 {
        self.made
    }

    /// Notes a tuning for the report.
    pub(crate) fn note(&mut self, tuning: GemmTuning) {
        self.report.push(tuning);
    }

    /// The tuning noted last, to add to.
    pub(crate) fn last_noted(&mut self) -> Option<&mut GemmTuning> {
        self.report.last_mut()
    }

    /// The tunings noted since the last call.
    pub(crate) fn take_report(&mut self) -> Vec<GemmTuning> {
        std::mem::take(&mut self.report)
    }
}
