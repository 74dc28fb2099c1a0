//! `map` (inline or on worker threads, order preserved), `map_seeded` (a map that draws random numbers: data
//! augmentation) and `filter`. A user function that returns an error or panics ends the stream with that error;
//! worker threads stop and are joined when the iterator is dropped.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};

use crate::dataset::{BoxIter, Cardinality, Dataset, Node, skip_by_pulling};
use crate::error::{Error, Result};
use crate::rng::{Rng, mix};

type MapFn<T, U> = dyn Fn(T) -> Result<U> + Send + Sync;
type FilterFn<T> = dyn Fn(&T) -> Result<bool> + Send + Sync;

/// The message of a caught panic.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Apply `f` to element `index`, turning its error or panic into the pipeline's error.
fn call<T, U>(f: &MapFn<T, U>, x: T, index: u64) -> Result<U> {
    match catch_unwind(AssertUnwindSafe(|| f(x))) {
        Ok(Ok(u)) => Ok(u),
        Ok(Err(e)) => Err(Error::Map {
            index,
            source: Box::new(e),
        }),
        Err(p) => Err(Error::Panicked {
            stage: "map",
            index,
            message: panic_message(p.as_ref()),
        }),
    }
}

struct MapNode<T, U> {
    input: Dataset<T>,
    f: Arc<MapFn<T, U>>,
    workers: usize,
    name: String,
}

impl<T: Send + 'static, U: Send + 'static> Node<U> for MapNode<T, U> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<U>> {
        // one output per input: the offset passes through without calling `f` on the skipped elements
        let input = self.input.node.open(key, skip)?;
        if self.workers <= 1 {
            let f = Arc::clone(&self.f);
            let mut input = input;
            let mut index = skip;
            let mut done = false;
            return Ok(Box::new(std::iter::from_fn(move || {
                if done {
                    return None;
                }
                let r = match input.next()? {
                    Ok(x) => call(f.as_ref(), x, index),
                    Err(e) => Err(e),
                };
                index += 1;
                done = r.is_err();
                Some(r)
            })));
        }
        Ok(Box::new(ParMapIter::start(
            input,
            Arc::clone(&self.f),
            self.workers,
            skip,
        )))
    }
    fn cardinality(&self) -> Cardinality {
        self.input.cardinality()
    }
    fn describe(&self) -> String {
        format!("map({}) <- {}", self.name, self.input.describe())
    }
}

/// Pairs every element with a generator of its own, seeded by the stage's seed, the epoch's key and the
/// element's index: the draws of element `i` are the same whichever worker runs it and wherever a resumed
/// iterator starts.
struct SeedNode<T> {
    input: Dataset<T>,
    seed: u64,
}

impl<T: Send + 'static> Node<(T, Rng)> for SeedNode<T> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<(T, Rng)>> {
        let stream = mix(self.seed, key);
        let input = self.input.node.open(key, skip)?;
        Ok(Box::new(input.zip(skip..).map(move |(x, i)| {
            x.map(|x| (x, Rng::new(mix(stream, i))))
        })))
    }
    fn cardinality(&self) -> Cardinality {
        self.input.cardinality()
    }
    fn describe(&self) -> String {
        format!("seeded({}) <- {}", self.seed, self.input.describe())
    }
}

/// A map on worker threads: the consumer's thread reads the input and hands out numbered jobs (at most
/// `2 * workers` in flight), workers send back numbered results, and the consumer yields them in input order.
struct ParMapIter<T, U> {
    input: Option<BoxIter<T>>,
    jobs: Option<Sender<(u64, T)>>,
    results: Option<Receiver<(u64, Result<U>)>>,
    ready: HashMap<u64, Result<U>>,
    next_send: u64,
    next_yield: u64,
    in_flight: u64,
    input_error: Option<Error>,
    workers: Vec<JoinHandle<()>>,
    done: bool,
}

impl<T: Send + 'static, U: Send + 'static> ParMapIter<T, U> {
    fn start(input: BoxIter<T>, f: Arc<MapFn<T, U>>, workers: usize, base: u64) -> Self {
        let (job_tx, job_rx) = bounded::<(u64, T)>(workers * 2);
        let (res_tx, res_rx) = unbounded::<(u64, Result<U>)>();
        let handles = (0..workers)
            .map(|w| {
                let job_rx = job_rx.clone();
                let res_tx = res_tx.clone();
                let f = Arc::clone(&f);
                std::thread::Builder::new()
                    .name(format!("cohort-data-map-{w}"))
                    .spawn(move || {
                        while let Ok((i, x)) = job_rx.recv() {
                            let r = call(f.as_ref(), x, base + i);
                            if res_tx.send((i, r)).is_err() {
                                break;
                            }
                        }
                    })
            })
            .filter_map(std::result::Result::ok)
            .collect();
        ParMapIter {
            input: Some(input),
            jobs: Some(job_tx),
            results: Some(res_rx),
            ready: HashMap::new(),
            next_send: 0,
            next_yield: 0,
            in_flight: workers as u64 * 2,
            input_error: None,
            workers: handles,
            done: false,
        }
    }

    fn shutdown(&mut self) {
        self.done = true;
        self.input = None;
        self.jobs = None;
        self.results = None;
        for h in self.workers.drain(..) {
            // a worker only ends by its loop; a panic inside `f` is caught there
            let _ = h.join();
        }
    }

    /// Hand out jobs until `in_flight` are outstanding or the input ends.
    fn fill(&mut self) {
        while self.next_send - self.next_yield < self.in_flight && self.input_error.is_none() {
            let Some(input) = self.input.as_mut() else {
                return;
            };
            match input.next() {
                Some(Ok(x)) => {
                    let sent = self
                        .jobs
                        .as_ref()
                        .is_some_and(|j| j.send((self.next_send, x)).is_ok());
                    if !sent {
                        self.input_error = Some(Error::Disconnected {
                            stage: "map",
                            reason: "the worker threads are gone (could not spawn them?)".into(),
                        });
                        return;
                    }
                    self.next_send += 1;
                }
                Some(Err(e)) => {
                    self.input = None;
                    self.input_error = Some(e);
                }
                None => self.input = None,
            }
        }
    }
}

impl<T: Send + 'static, U: Send + 'static> Iterator for ParMapIter<T, U> {
    type Item = Result<U>;

    fn next(&mut self) -> Option<Result<U>> {
        if self.done {
            return None;
        }
        if self.workers.is_empty() {
            self.shutdown();
            return Some(Err(Error::Disconnected {
                stage: "map",
                reason: "could not spawn any worker thread".into(),
            }));
        }
        self.fill();
        if self.next_yield == self.next_send {
            // every job handed out has been yielded: the input ended, possibly with an error
            let e = self.input_error.take();
            self.shutdown();
            return e.map(Err);
        }
        loop {
            if let Some(r) = self.ready.remove(&self.next_yield) {
                self.next_yield += 1;
                if r.is_err() {
                    self.shutdown();
                }
                return Some(r);
            }
            let got = self.results.as_ref().map(Receiver::recv);
            match got {
                Some(Ok((i, r))) => {
                    self.ready.insert(i, r);
                }
                _ => {
                    self.shutdown();
                    return Some(Err(Error::Disconnected {
                        stage: "map",
                        reason: "a worker thread exited before returning its result".into(),
                    }));
                }
            }
        }
    }
}

impl<T, U> Drop for ParMapIter<T, U> {
    fn drop(&mut self) {
        self.input = None;
        self.jobs = None;
        self.results = None;
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

struct FilterNode<T> {
    input: Dataset<T>,
    f: Arc<FilterFn<T>>,
}

impl<T: Send + 'static> Node<T> for FilterNode<T> {
    fn open(&self, key: u64, skip: u64) -> Result<BoxIter<T>> {
        let mut input = self.input.node.open(key, 0)?;
        let f = Arc::clone(&self.f);
        let mut index = 0u64;
        let mut done = false;
        let it = std::iter::from_fn(move || {
            while !done {
                let x = match input.next()? {
                    Ok(x) => x,
                    Err(e) => {
                        done = true;
                        return Some(Err(e));
                    }
                };
                let i = index;
                index += 1;
                match catch_unwind(AssertUnwindSafe(|| f(&x))) {
                    Ok(Ok(true)) => return Some(Ok(x)),
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => {
                        done = true;
                        return Some(Err(Error::Map {
                            index: i,
                            source: Box::new(e),
                        }));
                    }
                    Err(p) => {
                        done = true;
                        return Some(Err(Error::Panicked {
                            stage: "filter",
                            index: i,
                            message: panic_message(p.as_ref()),
                        }));
                    }
                }
            }
            None
        });
        skip_by_pulling(Box::new(it), skip)
    }
    fn cardinality(&self) -> Cardinality {
        match self.input.cardinality() {
            Cardinality::Finite(0) => Cardinality::Finite(0),
            _ => Cardinality::Unknown,
        }
    }
    fn describe(&self) -> String {
        format!("filter <- {}", self.input.describe())
    }
}

impl<T: Send + 'static> Dataset<T> {
    /// Apply `f` to every element, on the consumer's thread. An error or a panic in `f` ends the stream with an
    /// error naming the element.
    pub fn map<U, F>(&self, f: F) -> Dataset<U>
    where
        U: Send + 'static,
        F: Fn(T) -> Result<U> + Send + Sync + 'static,
    {
        self.map_parallel(1, f)
    }

    /// Apply `f` on `workers` threads (0 or 1: inline), keeping the input order, like `tf.data`'s
    /// `map(num_parallel_calls=workers, deterministic=True)`. An error or a panic in `f` ends the stream with that
    /// error, after the elements before it; the workers stop, and are joined when the iterator is dropped.
    pub fn map_parallel<U, F>(&self, workers: usize, f: F) -> Dataset<U>
    where
        U: Send + 'static,
        F: Fn(T) -> Result<U> + Send + Sync + 'static,
    {
        self.map_named("fn", workers, f)
    }

    /// [`map_parallel`](Self::map_parallel) with a name that goes into the [fingerprint](Self::fingerprint), so a
    /// saved position cannot be resumed on a pipeline with another function.
    pub fn map_named<U, F>(&self, name: &str, workers: usize, f: F) -> Dataset<U>
    where
        U: Send + 'static,
        F: Fn(T) -> Result<U> + Send + Sync + 'static,
    {
        Dataset {
            node: Arc::new(MapNode {
                input: self.clone(),
                f: Arc::new(f),
                workers,
                name: name.to_string(),
            }),
        }
    }

    /// [`map_named`](Self::map_named) for a function that draws random numbers (random crops and flips): `f` gets
    /// a generator of the element's own, derived from `seed`, the epoch and the element's index, so the output is
    /// the same on any number of workers, every epoch draws anew, and a resumed iterator continues exactly.
    pub fn map_seeded<U, F>(&self, name: &str, workers: usize, seed: u64, f: F) -> Dataset<U>
    where
        U: Send + 'static,
        F: Fn(T, &mut Rng) -> Result<U> + Send + Sync + 'static,
    {
        let seeded = Dataset {
            node: Arc::new(SeedNode {
                input: self.clone(),
                seed,
            }) as Arc<dyn Node<(T, Rng)>>,
        };
        seeded.map_named(name, workers, move |(x, mut rng)| f(x, &mut rng))
    }

    /// Keep the elements for which `f` returns `Ok(true)`; an error or a panic ends the stream.
    pub fn filter<F>(&self, f: F) -> Dataset<T>
    where
        F: Fn(&T) -> Result<bool> + Send + Sync + 'static,
    {
        Dataset {
            node: Arc::new(FilterNode {
                input: self.clone(),
                f: Arc::new(f),
            }),
        }
    }
}
