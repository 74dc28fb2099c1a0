//! `prefetch(n)`: a background thread runs the stages upstream and keeps up to `n` elements ready in a bounded
//! channel, so producing the next elements overlaps with consuming the current one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, bounded};

use crate::dataset::{BoxIter, Cardinality, Dataset, Node};
use crate::error::{Error, Result};
use crate::map::panic_message;

struct PrefetchNode<T> {
    input: Dataset<T>,
    n: usize,
}

impl<T: Send + 'static> Node<T> for PrefetchNode<T> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<T>> {
        // opened here so that an error in opening reaches the caller at once
        let input = self.input.node.open(key, skip)?;
        Ok(Box::new(PrefetchIter::start(input, self.n, "prefetch")?))
    }
    fn cardinality(&self) -> Cardinality {
        self.input.cardinality()
    }
    fn describe(&self) -> String {
        // the buffer size does not change the elements
        format!("prefetch <- {}", self.input.describe())
    }
}

/// The consuming end of a background producer thread.
pub(crate) struct PrefetchIter<T> {
    rx: Option<Receiver<Result<T>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stage: &'static str,
    done: bool,
}

impl<T: Send + 'static> PrefetchIter<T> {
    pub(crate) fn start(mut input: BoxIter<T>, n: usize, stage: &'static str) -> Result<Self> {
        let (tx, rx) = bounded::<Result<T>>(n.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("cohort-data-{stage}"))
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    let Some(item) = input.next() else { break };
                    let last = item.is_err();
                    // fails once the consumer is dropped: then stop
                    if tx.send(item).is_err() || last {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Disconnected {
                stage,
                reason: format!("could not spawn its thread: {e}"),
            })?;
        Ok(PrefetchIter {
            rx: Some(rx),
            stop,
            thread: Some(thread),
            stage,
            done: false,
        })
    }

    fn close(&mut self) -> Option<String> {
        self.done = true;
        self.stop.store(true, Ordering::Relaxed);
        self.rx = None;
        let joined = self.thread.take().map(JoinHandle::join);
        match joined {
            Some(Err(p)) => Some(panic_message(p.as_ref())),
            _ => None,
        }
    }
}

impl<T: Send + 'static> Iterator for PrefetchIter<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        if self.done {
            return None;
        }
        let got = self.rx.as_ref()?.recv();
        match got {
            Ok(item) => {
                if item.is_err() {
                    self.close();
                }
                Some(item)
            }
            // the producer ended: normally, or by a panic upstream that no stage caught
            Err(_) => self.close().map(|message| {
                Err(Error::Disconnected {
                    stage: self.stage,
                    reason: format!("its thread panicked: {message}"),
                })
            }),
        }
    }
}

impl<T> Drop for PrefetchIter<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // dropping the receiver first wakes a producer blocked on a full channel
        self.rx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<T: Send + 'static> Dataset<T> {
    /// Produce up to `n` elements ahead on a background thread (a bounded channel of `n`), like `tf.data`'s
    /// `prefetch`. Dropping the iterator stops the thread and joins it.
    pub fn prefetch(&self, n: usize) -> Dataset<T> {
        Dataset {
            node: Arc::new(PrefetchNode {
                input: self.clone(),
                n: n.max(1),
            }),
        }
    }
}
