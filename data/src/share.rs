//! `share(k)`: one producer thread runs the pipeline once; `k` consumers each receive every element, as an
//! `Arc` to the one copy. Each consumer has a bounded queue, so the producer runs at most `capacity` elements ahead
//! of the slowest consumer (backpressure). A dropped consumer is forgotten by the producer (its queue's sends fail at
//! once, even mid-send), and when the last consumer is dropped the producer stops and is joined.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};

use crate::dataset::{Dataset, Position};
use crate::error::{Error, Result};

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
    /// Elements each consumer's queue holds: how far the producer may run ahead of the slowest consumer.
    pub capacity: usize,
    /// Where the producer starts (all consumers start there).
    pub start: Position,
    /// Stop after this many epochs (counted from epoch 0); `None`: run until every consumer is dropped.
    pub epochs: Option<u64>,
}

impl ShareOptions {
    /// `consumers` consumers, queues of 2, from the start, without an epoch limit.
    pub fn new(consumers: usize) -> Self {
        ShareOptions {
            consumers,
            capacity: 2,
            start: Position::default(),
            epochs: None,
        }
    }
}

/// Joins the producer when the last consumer is dropped.
struct Producer {
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Producer {
    fn drop(&mut self) {
        let t = self.thread.get_mut().ok().and_then(Option::take);
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// One consumer of a shared pipeline: an iterator over `Arc`s to the elements every consumer sees. Like
/// [`Iter`](crate::Iter) it yields one epoch, then `None`, then the next epoch.
pub struct SharedIter<T> {
    // declared before `producer`: the queue closes before the last consumer joins the producer
    rx: Receiver<Msg<T>>,
    pos: Position,
    finished: bool,
    _producer: Arc<Producer>,
}

impl<T> fmt::Debug for SharedIter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedIter")
            .field("position", &self.pos)
            .field("finished", &self.finished)
            .finish()
    }
}

impl<T> SharedIter<T> {
    /// The position of the next element this consumer will receive.
    pub fn position(&self) -> Position {
        self.pos
    }

    fn take(&mut self, msg: Msg<T>) -> Option<Result<Arc<T>>> {
        match msg {
            Msg::Item(x) => {
                self.pos.index += 1;
                Some(Ok(x))
            }
            Msg::EndOfEpoch => {
                self.pos.epoch += 1;
                self.pos.index = 0;
                None
            }
            Msg::Error(e) => {
                self.finished = true;
                Some(Err(Error::Shared(e)))
            }
        }
    }

    /// Like `next`, but gives up after `timeout`: `Err(None)` on time-out, `Ok(..)` as `next` otherwise.
    pub fn next_timeout(
        &mut self,
        timeout: Duration,
    ) -> std::result::Result<Option<Result<Arc<T>>>, Duration> {
        if self.finished {
            return Ok(None);
        }
        match self.rx.recv_timeout(timeout) {
            Ok(msg) => Ok(self.take(msg)),
            Err(RecvTimeoutError::Timeout) => Err(timeout),
            Err(RecvTimeoutError::Disconnected) => {
                self.finished = true;
                Ok(None)
            }
        }
    }
}

impl<T> Iterator for SharedIter<T> {
    type Item = Result<Arc<T>>;
    fn next(&mut self) -> Option<Result<Arc<T>>> {
        if self.finished {
            return None;
        }
        match self.rx.recv() {
            Ok(msg) => self.take(msg),
            Err(_) => {
                self.finished = true;
                None
            }
        }
    }
}

/// Send `msg` to every live consumer, forgetting those that are gone; false when none is left.
fn broadcast<T>(senders: &mut Vec<Sender<Msg<T>>>, msg: &Msg<T>) -> bool {
    senders.retain(|tx| tx.send(msg.clone()).is_ok());
    !senders.is_empty()
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

    /// One producer thread runs the pipeline; each of `options.consumers` consumers receives every element (an
    /// `Arc` to one shared copy) and every end of epoch, in the same order. The producer waits for the slowest
    /// consumer (at most `capacity` elements ahead); a dropped consumer is skipped from then on; when all are
    /// dropped the producer stops. Consumers can move to other threads. A pipeline error reaches every consumer
    /// and stops the producer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 consumers or capacity; [`Error::Position`] for a start position of another
    /// pipeline; [`Error::Disconnected`] when the thread cannot be spawned.
    pub fn share_with(&self, options: ShareOptions) -> Result<Vec<SharedIter<T>>> {
        if options.consumers == 0 || options.capacity == 0 {
            return Err(Error::InvalidArgument {
                op: "share",
                reason: format!(
                    "{} consumers with queues of {}: both must be at least 1",
                    options.consumers, options.capacity
                ),
            });
        }
        let mut it = self.iter_from(&options.start)?;
        let start = it.position();
        let (mut senders, receivers): (Vec<_>, Vec<_>) = (0..options.consumers)
            .map(|_| bounded::<Msg<T>>(options.capacity))
            .unzip();
        let epochs = options.epochs;
        let thread = std::thread::Builder::new()
            .name("cohort-data-share".into())
            .spawn(move || {
                loop {
                    if epochs.is_some_and(|e| it.position().epoch >= e) {
                        break;
                    }
                    let msg = match it.next() {
                        Some(Ok(x)) => Msg::Item(Arc::new(x)),
                        Some(Err(e)) => Msg::Error(Arc::new(e)),
                        None => Msg::EndOfEpoch,
                    };
                    let stop = matches!(msg, Msg::Error(_));
                    if !broadcast(&mut senders, &msg) || stop {
                        break;
                    }
                }
                tracing::debug!(position = %it.position(), "shared pipeline producer stopped");
            })
            .map_err(|e| Error::Disconnected {
                stage: "share",
                reason: format!("could not spawn the producer thread: {e}"),
            })?;
        let producer = Arc::new(Producer {
            thread: Mutex::new(Some(thread)),
        });
        Ok(receivers
            .into_iter()
            .map(|rx| SharedIter {
                rx,
                pos: start,
                finished: false,
                _producer: Arc::clone(&producer),
            })
            .collect())
    }
}
