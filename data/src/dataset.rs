//! [`Dataset`]: an immutable description of a pipeline, from which any number of independent iterators are opened.
//!
//! Every stage can open its iterator *at an offset*: `open(key, skip)` gives the elements from `skip` on, for the
//! epoch whose random stages derive their generators from `key`. Stages that map one input to one output (`map`,
//! `batch`, `take`, `skip`, `zip`, `prefetch`, sources) pass the offset down, so resuming from a saved
//! [`Position`] does not redo their work; the others (`filter`, `shuffle`) replay their input from the epoch's
//! start, which is exact because the same key gives the same draws.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::array::{Slices, Stack};
use crate::error::{Error, Result};
use crate::rng::{Rng, mix, splitmix64};

/// An iterator of a pipeline stage.
pub(crate) type BoxIter<T> = Box<dyn Iterator<Item = Result<T>> + Send>;

/// How many elements a dataset yields per epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Cardinality {
    /// Exactly this many.
    Finite(u64),
    /// Never ends (`repeat(None)` of a non-empty dataset).
    Infinite,
    /// Not known without running it (after `filter`, or from an iterator source).
    Unknown,
}

/// One stage of a pipeline.
pub(crate) trait Node<T>: Send + Sync {
    /// The elements from `skip` on, for the epoch keyed by `key`.
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<T>>;
    fn cardinality(&self) -> Cardinality;
    /// A description of the stage and its inputs, with every parameter that changes its output (seeds, sizes).
    fn describe(&self) -> String;
}

/// Drop the first `skip` elements of `it` by running them; an error among them is returned.
pub(crate) fn skip_by_pulling<T: Send + 'static>(
    mut it: BoxIter<T>,
    skip: u64,
) -> Result<BoxIter<T>> {
    for _ in 0..skip {
        match it.next() {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e),
            None => break,
        }
    }
    Ok(it)
}

/// Where an iterator stands: the epoch, the number of elements it has yielded in that epoch, the epoch's random
/// state, and the fingerprint of the pipeline (its structure, sizes and seeds). Every random stage draws from a
/// generator seeded by its own seed mixed with `rng`, so these numbers are all it takes to continue with the very
/// same elements (stages that cannot seek replay the epoch from its start under the same draws). Serializable with
/// serde, to go into a checkpoint.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Position {
    /// Epochs completed.
    pub epoch: u64,
    /// Elements yielded so far in this epoch.
    pub index: u64,
    /// The epoch's random state ([`Position::epoch_key`]), which every random stage mixes with its seed; 0 in a
    /// hand-made position means "derive it from `epoch`".
    #[serde(default)]
    pub rng: u64,
    /// Fingerprint of the pipeline that saved it ([`Dataset::fingerprint`]); 0 accepts any pipeline.
    #[serde(default)]
    pub fingerprint: u64,
}

impl Position {
    /// The position at `index` of `epoch`, valid for any pipeline.
    pub fn new(epoch: u64, index: u64) -> Self {
        Position {
            epoch,
            index,
            rng: Self::epoch_key(epoch),
            fingerprint: 0,
        }
    }

    /// The position in a pipeline rebuilt with batches of `new_batch` instead of `old_batch` (the trainer shrinking
    /// a batch after an out-of-memory error): the same epoch and shuffle, from the first example not yet seen,
    /// rounded down to a whole new batch (so at most `new_batch - 1` examples are seen twice). The fingerprint is
    /// cleared, since the rebuilt pipeline has another one.
    pub fn rebatched(&self, old_batch: usize, new_batch: usize) -> Position {
        let seen = self.index.saturating_mul(old_batch.max(1) as u64);
        Position {
            index: seen / new_batch.max(1) as u64,
            fingerprint: 0,
            ..*self
        }
    }

    /// The random state of `epoch`: the key every random stage mixes with its seed.
    pub fn epoch_key(epoch: u64) -> u64 {
        splitmix64(epoch ^ 0x005E_ED0F_E90C).max(1)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {} element {}", self.epoch, self.index)
    }
}

/// A pipeline of examples, like `tf.data.Dataset`: built from a source by adapters, each returning a new
/// `Dataset`; cheap to clone (the stages are shared). Iterating never changes it, so any number of independent
/// iterators (see [`Dataset::iter`]) can run at once, each with its own position.
pub struct Dataset<T> {
    pub(crate) node: Arc<dyn Node<T>>,
}

impl<T> Clone for Dataset<T> {
    fn clone(&self) -> Self {
        Dataset {
            node: Arc::clone(&self.node),
        }
    }
}

impl<T> fmt::Debug for Dataset<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dataset")
            .field("pipeline", &self.node.describe())
            .field("cardinality", &self.node.cardinality())
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// sources

struct RangeNode {
    start: i64,
    end: i64,
}

impl Node<i64> for RangeNode {
    fn open(&self, _key: u64, skip: u64) -> Result<BoxIter<i64>> {
        let first = self
            .start
            .saturating_add(i64::try_from(skip).unwrap_or(i64::MAX));
        Ok(Box::new((first.min(self.end)..self.end).map(Ok)))
    }
    fn cardinality(&self) -> Cardinality {
        Cardinality::Finite(self.end.saturating_sub(self.start).max(0) as u64)
    }
    fn describe(&self) -> String {
        format!("range({},{})", self.start, self.end)
    }
}

struct SlicesNode<S> {
    slices: Arc<S>,
}

impl<S: Slices> Node<S::Item> for SlicesNode<S> {
    fn open(&self, _key: u64, skip: u64) -> Result<BoxIter<S::Item>> {
        let s = Arc::clone(&self.slices);
        let n = s.len();
        let first = usize::try_from(skip).unwrap_or(usize::MAX).min(n);
        Ok(Box::new((first..n).map(move |i| s.slice(i))))
    }
    fn cardinality(&self) -> Cardinality {
        Cardinality::Finite(self.slices.len() as u64)
    }
    fn describe(&self) -> String {
        format!("slices({})", self.slices.len())
    }
}

type IterFactory<T> = dyn Fn() -> Result<BoxIter<T>> + Send + Sync;

struct FnNode<T> {
    name: String,
    factory: Box<IterFactory<T>>,
}

impl<T: Send + 'static> Node<T> for FnNode<T> {
    fn open(&self, _key: u64, skip: u64) -> Result<BoxIter<T>> {
        skip_by_pulling((self.factory)()?, skip)
    }
    fn cardinality(&self) -> Cardinality {
        Cardinality::Unknown
    }
    fn describe(&self) -> String {
        format!("source({})", self.name)
    }
}

impl Dataset<i64> {
    /// The integers `start..end`, like `tf.data.Dataset.range`.
    pub fn range(start: i64, end: i64) -> Self {
        Dataset {
            node: Arc::new(RangeNode { start, end }),
        }
    }
}

impl<T: Send + 'static> Dataset<T> {
    /// One example per slice of `slices` along its first dimension: an [`Array`](crate::Array), a `Vec` of
    /// examples, or a tuple of those (zipped; the shortest decides the length), like
    /// `tf.data.Dataset.from_tensor_slices`. The data is shared, not copied, by every iterator.
    pub fn from_tensor_slices<S: Slices<Item = T>>(slices: S) -> Self {
        Dataset {
            node: Arc::new(SlicesNode {
                slices: Arc::new(slices),
            }),
        }
    }

    /// The elements of a vector, in order.
    pub fn from_vec(items: Vec<T>) -> Self
    where
        T: Clone + Sync,
    {
        Dataset::from_tensor_slices(items)
    }

    /// A source that calls `factory` for each epoch and yields what its iterator yields (streaming files, for
    /// instance). `name` goes into the fingerprint. Resuming replays the epoch up to the saved index.
    pub fn from_iter_fn<F, I>(name: impl Into<String>, factory: F) -> Self
    where
        F: Fn() -> Result<I> + Send + Sync + 'static,
        I: Iterator<Item = Result<T>> + Send + 'static,
    {
        Dataset {
            node: Arc::new(FnNode {
                name: name.into(),
                factory: Box::new(move || Ok(Box::new(factory()?) as BoxIter<T>)),
            }),
        }
    }

    /// How many elements one epoch yields, when that is known without running it.
    pub fn cardinality(&self) -> Cardinality {
        self.node.cardinality()
    }

    /// A description of the pipeline, stage by stage.
    pub fn describe(&self) -> String {
        self.node.describe()
    }

    /// A hash of [`describe`](Self::describe): equal for pipelines built alike with the same sizes and seeds.
    pub fn fingerprint(&self) -> u64 {
        // FNV-1a, then spread; never 0, which marks a position valid for any pipeline
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.describe().bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        splitmix64(h).max(1)
    }

    /// An iterator from the start of epoch 0.
    pub fn iter(&self) -> Iter<T> {
        Iter {
            dataset: self.clone(),
            inner: None,
            pos: Position {
                epoch: 0,
                index: 0,
                rng: Position::epoch_key(0),
                fingerprint: self.fingerprint(),
            },
            failed: false,
        }
    }

    /// An iterator that continues from a saved position: it yields exactly what the saving iterator would have
    /// yielded next.
    ///
    /// # Errors
    /// [`Error::Position`] when `pos` was saved by a pipeline with another fingerprint, or holds a random state
    /// that is not its epoch's (saved by a version that derived seeds differently).
    pub fn iter_from(&self, pos: &Position) -> Result<Iter<T>> {
        let key = Position::epoch_key(pos.epoch);
        if pos.rng != 0 && pos.rng != key {
            return Err(Error::Position {
                reason: format!(
                    "random state {:016x} saved for epoch {}, where this version derives {key:016x}",
                    pos.rng, pos.epoch
                ),
            });
        }
        let fp = self.fingerprint();
        if pos.fingerprint != 0 && pos.fingerprint != fp {
            return Err(Error::Position {
                reason: format!(
                    "pipeline fingerprint {:016x} in the position, {fp:016x} here ({})",
                    pos.fingerprint,
                    self.describe()
                ),
            });
        }
        tracing::debug!(epoch = pos.epoch, index = pos.index, pipeline = %self.describe(), "resuming a dataset iterator");
        let mut it = self.iter();
        it.pos = Position {
            epoch: pos.epoch,
            index: pos.index,
            rng: key,
            fingerprint: fp,
        };
        Ok(it)
    }

    fn wrap<U>(node: impl Node<U> + 'static) -> Dataset<U> {
        Dataset {
            node: Arc::new(node),
        }
    }

    /// Randomly shuffle with a buffer of `buffer` elements, like `tf.data`'s `shuffle`: the first `buffer` inputs
    /// fill it, and each output is a uniformly chosen element of the buffer, replaced by the next input. A buffer
    /// at least as large as the dataset gives a uniform permutation. Each epoch shuffles differently, and the same
    /// `seed` and epoch always give the same order.
    pub fn shuffle(&self, buffer: usize, seed: u64) -> Dataset<T> {
        Self::wrap(ShuffleNode {
            input: self.clone(),
            buffer: buffer.max(1),
            seed,
        })
    }

    /// Group consecutive elements into batches of `n` (stacked by [`Stack`]); the last, smaller batch is dropped
    /// when `drop_remainder` is true.
    pub fn batch(&self, n: usize, drop_remainder: bool) -> Dataset<T::Batched>
    where
        T: Stack,
    {
        Self::wrap(BatchNode {
            input: self.clone(),
            n: n.max(1),
            drop_remainder,
            pad: None,
        })
    }

    /// Like [`batch`](Self::batch), padding each dimension to the longest example of the batch with `pad`
    /// (token sequences of different lengths).
    pub fn padded_batch(&self, n: usize, pad: f64, drop_remainder: bool) -> Dataset<T::Batched>
    where
        T: Stack,
    {
        Self::wrap(BatchNode {
            input: self.clone(),
            n: n.max(1),
            drop_remainder,
            pad: Some(pad),
        })
    }

    /// Repeat the dataset `count` times, or forever with `None`. Each repetition is a new pass: shuffles upstream
    /// draw a new order. Repeating an empty dataset forever yields nothing (it does not spin).
    pub fn repeat(&self, count: Option<u64>) -> Dataset<T> {
        Self::wrap(RepeatNode {
            input: self.clone(),
            count,
        })
    }

    /// At most the first `n` elements.
    pub fn take(&self, n: u64) -> Dataset<T> {
        Self::wrap(TakeNode {
            input: self.clone(),
            n,
        })
    }

    /// All but the first `n` elements.
    pub fn skip(&self, n: u64) -> Dataset<T> {
        Self::wrap(SkipNode {
            input: self.clone(),
            n,
        })
    }

    /// Pairs of elements of `self` and `other`, until either ends.
    pub fn zip<U: Send + 'static>(&self, other: &Dataset<U>) -> Dataset<(T, U)> {
        Self::wrap(ZipNode {
            a: self.clone(),
            b: other.clone(),
        })
    }

    /// Keep the elements of the first complete pass in memory and serve later passes from there, like `tf.data`'s
    /// `cache()`. The cache is shared by every iterator and clone of the returned dataset.
    pub fn cache(&self) -> Dataset<T>
    where
        T: Clone + Sync,
    {
        Self::wrap(CacheNode {
            input: self.clone(),
            store: Arc::new(Mutex::new(None)),
        })
    }
}

// ---------------------------------------------------------------------------------------------------------------
// the iterator

/// An iterator over a [`Dataset`], one epoch at a time: it yields the epoch's elements, then `None` once; the next
/// call starts the next epoch (reshuffled). So `for x in &mut it { .. }` runs one epoch. After an error it yields
/// `None` forever; rebuild it from its last [`pos`](Self::pos) to retry.
pub struct Iter<T> {
    dataset: Dataset<T>,
    inner: Option<BoxIter<T>>,
    pos: Position,
    failed: bool,
}

impl<T> fmt::Debug for Iter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iter")
            .field("position", &self.pos)
            .field("failed", &self.failed)
            .finish()
    }
}

impl<T: Send + 'static> Iter<T> {
    /// The position of the next element (named `pos`, not `position`, which `Iterator` already has): save it, and [`Dataset::iter_from`] continues from here.
    pub fn pos(&self) -> Position {
        self.pos
    }

    /// Whether an error ended this iterator.
    pub fn failed(&self) -> bool {
        self.failed
    }
}

impl<T: Send + 'static> Iterator for Iter<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        if self.failed {
            return None;
        }
        if self.inner.is_none() {
            match self.dataset.node.open(self.pos.rng, self.pos.index) {
                Ok(it) => self.inner = Some(it),
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
        let inner = self.inner.as_mut()?;
        match inner.next() {
            Some(Ok(x)) => {
                self.pos.index += 1;
                Some(Ok(x))
            }
            Some(Err(e)) => {
                self.failed = true;
                self.inner = None;
                Some(Err(e))
            }
            None => {
                self.inner = None;
                self.pos.epoch += 1;
                self.pos.index = 0;
                self.pos.rng = Position::epoch_key(self.pos.epoch);
                None
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// adapters

struct ShuffleNode<T> {
    input: Dataset<T>,
    buffer: usize,
    seed: u64,
}

impl<T: Send + 'static> Node<T> for ShuffleNode<T> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<T>> {
        let it = ShuffleIter {
            input: Some(self.input.node.open(key, 0)?),
            buf: Vec::with_capacity(self.buffer.min(1 << 20)),
            size: self.buffer,
            rng: Rng::new(mix(self.seed, key)),
        };
        skip_by_pulling(Box::new(it), skip)
    }
    fn cardinality(&self) -> Cardinality {
        self.input.cardinality()
    }
    fn describe(&self) -> String {
        format!(
            "shuffle({},seed={}) <- {}",
            self.buffer,
            self.seed,
            self.input.describe()
        )
    }
}

struct ShuffleIter<T> {
    input: Option<BoxIter<T>>,
    buf: Vec<T>,
    size: usize,
    rng: Rng,
}

impl<T> ShuffleIter<T> {
    /// The next input, `Ok(None)` once the input is exhausted.
    fn pull(&mut self) -> Result<Option<T>> {
        let Some(input) = self.input.as_mut() else {
            return Ok(None);
        };
        match input.next() {
            Some(Ok(x)) => Ok(Some(x)),
            Some(Err(e)) => {
                self.input = None;
                Err(e)
            }
            None => {
                self.input = None;
                Ok(None)
            }
        }
    }
}

impl<T> Iterator for ShuffleIter<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        while self.buf.len() < self.size {
            match self.pull() {
                Ok(Some(x)) => self.buf.push(x),
                Ok(None) => break,
                Err(e) => {
                    self.buf.clear();
                    return Some(Err(e));
                }
            }
        }
        if self.buf.is_empty() {
            return None;
        }
        let i = self.rng.below(self.buf.len() as u64) as usize;
        Some(Ok(self.buf.swap_remove(i)))
    }
}

struct BatchNode<T> {
    input: Dataset<T>,
    n: usize,
    drop_remainder: bool,
    pad: Option<f64>,
}

impl<T: Stack> Node<T::Batched> for BatchNode<T> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<T::Batched>> {
        let mut input = self
            .input
            .node
            .open(key, skip.saturating_mul(self.n as u64))?;
        let (n, drop_remainder, pad) = (self.n, self.drop_remainder, self.pad);
        let mut done = false;
        Ok(Box::new(std::iter::from_fn(move || {
            if done {
                return None;
            }
            let mut items = Vec::with_capacity(n);
            while items.len() < n {
                match input.next() {
                    Some(Ok(x)) => items.push(x),
                    Some(Err(e)) => {
                        done = true;
                        return Some(Err(e));
                    }
                    None => {
                        done = true;
                        break;
                    }
                }
            }
            if items.is_empty() || (drop_remainder && items.len() < n) {
                return None;
            }
            Some(match pad {
                Some(p) => T::stack_padded(items, p),
                None => T::stack(items),
            })
        })))
    }
    fn cardinality(&self) -> Cardinality {
        match self.input.cardinality() {
            Cardinality::Finite(l) => {
                let n = self.n as u64;
                Cardinality::Finite(if self.drop_remainder {
                    l / n
                } else {
                    l.div_ceil(n)
                })
            }
            c => c,
        }
    }
    fn describe(&self) -> String {
        let kind = if self.pad.is_some() {
            "padded_batch"
        } else {
            "batch"
        };
        format!(
            "{kind}({},{},{:?}) <- {}",
            self.n,
            self.drop_remainder,
            self.pad,
            self.input.describe()
        )
    }
}

struct RepeatNode<T> {
    input: Dataset<T>,
    count: Option<u64>,
}

impl<T: Send + 'static> Node<T> for RepeatNode<T> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<T>> {
        let (mut rep, mut offset, exact) = match self.input.cardinality() {
            Cardinality::Finite(l) if l > 0 => (skip / l, skip % l, true),
            _ => (0, 0, false),
        };
        if let Some(c) = self.count {
            if rep >= c {
                return Ok(Box::new(std::iter::empty()));
            }
        }
        let node = Arc::clone(&self.input.node);
        let count = self.count;
        let mut current: Option<BoxIter<T>> = None;
        let mut yielded_this_rep = false;
        let mut done = false;
        let it = std::iter::from_fn(move || {
            loop {
                if done {
                    return None;
                }
                if current.is_none() {
                    match node.open(mix(key, rep), offset) {
                        Ok(it) => current = Some(it),
                        Err(e) => {
                            done = true;
                            return Some(Err(e));
                        }
                    }
                    offset = 0;
                    yielded_this_rep = false;
                }
                match current.as_mut().and_then(Iterator::next) {
                    Some(Ok(x)) => {
                        yielded_this_rep = true;
                        return Some(Ok(x));
                    }
                    Some(Err(e)) => {
                        done = true;
                        return Some(Err(e));
                    }
                    None => {
                        current = None;
                        rep += 1;
                        // an empty pass would repeat forever without yielding
                        if !yielded_this_rep || count.is_some_and(|c| rep >= c) {
                            done = true;
                        }
                    }
                }
            }
        });
        if exact {
            Ok(Box::new(it))
        } else {
            skip_by_pulling(Box::new(it), skip)
        }
    }
    fn cardinality(&self) -> Cardinality {
        match (self.input.cardinality(), self.count) {
            (Cardinality::Finite(0), _) | (_, Some(0)) => Cardinality::Finite(0),
            (Cardinality::Finite(l), Some(c)) => Cardinality::Finite(l.saturating_mul(c)),
            (Cardinality::Finite(_), None) | (Cardinality::Infinite, _) => Cardinality::Infinite,
            (Cardinality::Unknown, _) => Cardinality::Unknown,
        }
    }
    fn describe(&self) -> String {
        format!("repeat({:?}) <- {}", self.count, self.input.describe())
    }
}

struct TakeNode<T> {
    input: Dataset<T>,
    n: u64,
}

impl<T: Send + 'static> Node<T> for TakeNode<T> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<T>> {
        if skip >= self.n {
            return Ok(Box::new(std::iter::empty()));
        }
        let left = usize::try_from(self.n - skip).unwrap_or(usize::MAX);
        Ok(Box::new(self.input.node.open(key, skip)?.take(left)))
    }
    fn cardinality(&self) -> Cardinality {
        match self.input.cardinality() {
            Cardinality::Finite(l) => Cardinality::Finite(l.min(self.n)),
            Cardinality::Infinite => Cardinality::Finite(self.n),
            Cardinality::Unknown => Cardinality::Unknown,
        }
    }
    fn describe(&self) -> String {
        format!("take({}) <- {}", self.n, self.input.describe())
    }
}

struct SkipNode<T> {
    input: Dataset<T>,
    n: u64,
}

impl<T: Send + 'static> Node<T> for SkipNode<T> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<T>> {
        self.input.node.open(key, self.n.saturating_add(skip))
    }
    fn cardinality(&self) -> Cardinality {
        match self.input.cardinality() {
            Cardinality::Finite(l) => Cardinality::Finite(l.saturating_sub(self.n)),
            c => c,
        }
    }
    fn describe(&self) -> String {
        format!("skip({}) <- {}", self.n, self.input.describe())
    }
}

struct ZipNode<A, B> {
    a: Dataset<A>,
    b: Dataset<B>,
}

impl<A: Send + 'static, B: Send + 'static> Node<(A, B)> for ZipNode<A, B> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<(A, B)>> {
        let mut a = self.a.node.open(mix(key, 1), skip)?;
        let mut b = self.b.node.open(mix(key, 2), skip)?;
        let mut done = false;
        Ok(Box::new(std::iter::from_fn(move || {
            if done {
                return None;
            }
            let r = match (a.next(), b.next()) {
                (Some(Ok(x)), Some(Ok(y))) => return Some(Ok((x, y))),
                (Some(Err(e)), _) | (_, Some(Err(e))) => Some(Err(e)),
                _ => None,
            };
            done = true;
            r
        })))
    }
    fn cardinality(&self) -> Cardinality {
        use Cardinality::*;
        match (self.a.cardinality(), self.b.cardinality()) {
            (Finite(x), Finite(y)) => Finite(x.min(y)),
            (Finite(x), _) | (_, Finite(x)) if x == 0 => Finite(0),
            (Infinite, Infinite) => Infinite,
            (Finite(x), Infinite) | (Infinite, Finite(x)) => Finite(x),
            _ => Unknown,
        }
    }
    fn describe(&self) -> String {
        format!("zip({} | {})", self.a.describe(), self.b.describe())
    }
}

type CacheStore<T> = Arc<Mutex<Option<Arc<Vec<T>>>>>;

struct CacheNode<T> {
    input: Dataset<T>,
    store: CacheStore<T>,
}

impl<T: Clone + Send + Sync + 'static> Node<T> for CacheNode<T> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<T>> {
        let cached = self
            .store
            .lock()
            .map_err(|_| Error::Disconnected {
                stage: "cache",
                reason: "a thread filling the cache panicked".into(),
            })?
            .clone();
        if let Some(items) = cached {
            let first = usize::try_from(skip).unwrap_or(usize::MAX).min(items.len());
            return Ok(Box::new(
                (first..items.len()).map(move |i| Ok(items[i].clone())),
            ));
        }
        let mut input = self.input.node.open(key, 0)?;
        let store = Arc::clone(&self.store);
        let mut seen: Vec<T> = Vec::new();
        let mut done = false;
        let it = std::iter::from_fn(move || {
            if done {
                return None;
            }
            match input.next() {
                Some(Ok(x)) => {
                    seen.push(x.clone());
                    Some(Ok(x))
                }
                Some(Err(e)) => {
                    done = true;
                    Some(Err(e))
                }
                None => {
                    done = true;
                    if let Ok(mut slot) = store.lock() {
                        if slot.is_none() {
                            *slot = Some(Arc::new(std::mem::take(&mut seen)));
                        }
                    }
                    None
                }
            }
        });
        skip_by_pulling(Box::new(it), skip)
    }
    fn cardinality(&self) -> Cardinality {
        self.input.cardinality()
    }
    fn describe(&self) -> String {
        format!("cache <- {}", self.input.describe())
    }
}
