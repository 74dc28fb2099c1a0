//! `share(k)`: one run of a pipeline read by `k` consumers, each of which receives every element (an `Arc` to the
//! one copy) and every end of epoch, in the same order.
//!
//! There is no extra thread: the consumer that first needs an element the others have not produced yet pulls it
//! from the pipeline (without holding the lock, so the others keep reading what is buffered), and the element
//! stays in a shared ring until every live consumer has read it. A consumer may run at most `capacity` elements
//! ahead of the slowest live one and waits there (backpressure). A dropped consumer no longer counts, so it never
//! holds the others back. Put `prefetch(n)` before `share` to produce ahead on a background thread.

use std::collections::VecDeque;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::dataset::{Dataset, Iter, Position};
use crate::error::{Error, Result};
use crate::map::panic_message;

enum Msg<T> {
    Item(Arc<T>),
    EndOfEpoch,
    Error(Arc<Error>),
}

impl<T> Clone for Msg<T> {
    fn clone(&self) -> Self {
        match self {
            Msg::Item(x) => Msg::Item(Arc::clone(x)),
            Msg::EndOfEpoch => Msg::EndOfEpoch,
            Msg::Error(e) => Msg::Error(Arc::clone(e)),
        }
    }
}

/// Settings of [`Dataset::share_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareOptions {
    /// Number of consumers.
    pub consumers: usize,
    /// How many elements the fastest consumer may be ahead of the slowest live one.
    pub capacity: usize,
    /// Where the pipeline starts (all consumers start there).
    pub start: Position,
    /// End after this many epochs (counted from epoch 0); `None`: no end but the pipeline's own.
    pub epochs: Option<u64>,
}

impl ShareOptions {
    /// `consumers` consumers, up to 2 elements apart, from the start, without an epoch limit.
    pub fn new(consumers: usize) -> Self {
        ShareOptions {
            consumers,
            capacity: 2,
            start: Position::default(),
            epochs: None,
        }
    }
}

struct State<T> {
    /// Produced elements not yet read by every live consumer; `buf[0]` has sequence number `base`.
    buf: VecDeque<Msg<T>>,
    base: u64,
    /// Next sequence number of each consumer; `None` once dropped.
    cursors: Vec<Option<u64>>,
    /// The pipeline; taken out while a consumer produces from it.
    source: Option<Iter<T>>,
    producing: bool,
    /// No element will come after the buffered ones.
    done: bool,
}

impl<T> State<T> {
    fn end(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    fn slowest(&self) -> Option<u64> {
        self.cursors.iter().flatten().copied().min()
    }

    /// Drop the elements every live consumer has read.
    fn trim(&mut self) {
        let min = self.slowest().unwrap_or(u64::MAX);
        while self.base < min && !self.buf.is_empty() {
            self.buf.pop_front();
            self.base += 1;
        }
    }
}

struct Shared<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
    capacity: u64,
    epochs: Option<u64>,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // a panic while holding the lock can only come from this module's bookkeeping; the state stays usable
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One consumer of a shared pipeline: an iterator over `Arc`s to the elements every consumer sees. Like
/// [`Iter`] it yields one epoch, then `None`, then the next epoch. It can move to another thread.
pub struct SharedIter<T> {
    shared: Arc<Shared<T>>,
    id: usize,
    pos: Position,
    finished: bool,
}

impl<T> fmt::Debug for SharedIter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedIter")
            .field("consumer", &self.id)
            .field("position", &self.pos)
            .field("finished", &self.finished)
            .finish()
    }
}

impl<T: Send + 'static> SharedIter<T> {
    /// The position of the next element this consumer will receive.
    pub fn pos(&self) -> Position {
        self.pos
    }

    fn take(&mut self, msg: Option<Msg<T>>) -> Option<Result<Arc<T>>> {
        match msg {
            Some(Msg::Item(x)) => {
                self.pos.index += 1;
                Some(Ok(x))
            }
            Some(Msg::EndOfEpoch) => {
                self.pos.epoch += 1;
                self.pos.index = 0;
                self.pos.rng = Position::epoch_key(self.pos.epoch);
                None
            }
            Some(Msg::Error(e)) => {
                self.finished = true;
                Some(Err(Error::Shared(e)))
            }
            None => {
                self.finished = true;
                None
            }
        }
    }

    /// Like `next`, but gives up waiting after `timeout` (`Err(timeout)`); `Ok(..)` is what `next` returns.
    pub fn next_timeout(
        &mut self,
        timeout: Duration,
    ) -> std::result::Result<Option<Result<Arc<T>>>, Duration> {
        if self.finished {
            return Ok(None);
        }
        let msg = self
            .receive(Some(Instant::now() + timeout))
            .map_err(|()| timeout)?;
        Ok(self.take(msg))
    }

    /// The next message for this consumer; `Ok(None)` when the run is over, `Err(())` on time-out.
    fn receive(&mut self, deadline: Option<Instant>) -> std::result::Result<Option<Msg<T>>, ()> {
        let shared = Arc::clone(&self.shared);
        let mut st = shared.lock();
        loop {
            let Some(cur) = st.cursors[self.id] else {
                return Ok(None);
            };
            if cur < st.end() {
                let msg = st.buf[(cur - st.base) as usize].clone();
                st.cursors[self.id] = Some(cur + 1);
                st.trim();
                shared.changed.notify_all();
                return Ok(Some(msg));
            }
            if st.done {
                return Ok(None);
            }
            let ahead = st.end() - st.slowest().unwrap_or(cur);
            if st.producing || ahead >= shared.capacity {
                // another consumer is producing, or this one is too far ahead of the slowest
                st = match deadline {
                    None => shared
                        .changed
                        .wait(st)
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Err(());
                        }
                        shared
                            .changed
                            .wait_timeout(st, left)
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .0
                    }
                };
                continue;
            }
            let Some(mut source) = st.source.take() else {
                st.done = true;
                continue;
            };
            st.producing = true;
            drop(st);
            let msg = produce(&mut source, shared.epochs);
            st = shared.lock();
            st.producing = false;
            match msg {
                Some(m) => {
                    if matches!(m, Msg::Error(_)) {
                        st.done = true;
                    } else {
                        st.source = Some(source);
                    }
                    st.buf.push_back(m);
                }
                None => st.done = true,
            }
            shared.changed.notify_all();
        }
    }
}

/// The pipeline's next message, `None` at the epoch limit. A panic that escaped the pipeline becomes an error, so
/// the other consumers are never left waiting for a producer that is gone.
fn produce<T: Send + 'static>(source: &mut Iter<T>, epochs: Option<u64>) -> Option<Msg<T>> {
    if epochs.is_some_and(|e| source.pos().epoch >= e) {
        return None;
    }
    match catch_unwind(AssertUnwindSafe(|| source.next())) {
        Ok(Some(Ok(x))) => Some(Msg::Item(Arc::new(x))),
        Ok(Some(Err(e))) => Some(Msg::Error(Arc::new(e))),
        Ok(None) => Some(Msg::EndOfEpoch),
        Err(p) => Some(Msg::Error(Arc::new(Error::Disconnected {
            stage: "share",
            reason: format!("the pipeline panicked: {}", panic_message(p.as_ref())),
        }))),
    }
}

impl<T: Send + 'static> Iterator for SharedIter<T> {
    type Item = Result<Arc<T>>;
    fn next(&mut self) -> Option<Result<Arc<T>>> {
        if self.finished {
            return None;
        }
        let msg = self.receive(None).unwrap_or(None);
        self.take(msg)
    }
}

impl<T> Drop for SharedIter<T> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.cursors[self.id] = None;
        st.trim();
        self.shared.changed.notify_all();
    }
}

impl<T: Send + Sync + 'static> Dataset<T> {
    /// `k` consumers of one run of this pipeline, from the start; see [`share_with`](Self::share_with).
    ///
    /// # Errors
    /// As [`share_with`](Self::share_with).
    pub fn share(&self, k: usize) -> Result<Vec<SharedIter<T>>> {
        self.share_with(ShareOptions::new(k))
    }

    /// `k` consumers of one run of this pipeline from `start` (a position saved from one of them).
    ///
    /// # Errors
    /// As [`share_with`](Self::share_with).
    pub fn share_from(&self, k: usize, start: &Position) -> Result<Vec<SharedIter<T>>> {
        self.share_with(ShareOptions {
            start: *start,
            ..ShareOptions::new(k)
        })
    }

    /// One run of the pipeline for `options.consumers` consumers: each receives every element (an `Arc` to one
    /// shared copy) and every end of epoch, in the same order. The fastest waits when it is `capacity` elements
    /// ahead of the slowest live consumer; a dropped consumer is skipped from then on, and the pipeline (with its
    /// threads) stops when the last is dropped. A pipeline error reaches every consumer and ends the run.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 consumers or capacity; [`Error::Position`] for a start position of another
    /// pipeline.
    pub fn share_with(&self, options: ShareOptions) -> Result<Vec<SharedIter<T>>> {
        if options.consumers == 0 || options.capacity == 0 {
            return Err(Error::InvalidArgument {
                op: "share",
                reason: format!(
                    "{} consumers with capacity {}: both must be at least 1",
                    options.consumers, options.capacity
                ),
            });
        }
        let it = self.iter_from(&options.start)?;
        tracing::debug!(consumers = options.consumers, capacity = options.capacity, start = %options.start, "sharing a pipeline");
        let start = it.pos();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                buf: VecDeque::new(),
                base: 0,
                cursors: vec![Some(0); options.consumers],
                source: Some(it),
                producing: false,
                done: false,
            }),
            changed: Condvar::new(),
            capacity: options.capacity as u64,
            epochs: options.epochs,
        });
        Ok((0..options.consumers)
            .map(|id| SharedIter {
                shared: Arc::clone(&shared),
                id,
                pos: start,
                finished: false,
            })
            .collect())
    }
}
