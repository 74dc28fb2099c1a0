//! Seeded synthetic sources that a model can learn, for tests and benchmarks without files: Gaussian class blobs
//! of any shape, and token sequences (classes by preferred tokens, or a Markov chain to predict). Every example is
//! generated when it is asked for, from the seed and its index: the same seed gives the same data.

use std::fmt;

use crate::array::Array;
use crate::error::{Error, Result};
use crate::rng::{Rng, mix};
use crate::source::grouped;
use crate::source::{Examples, Task};
use crate::synthetic::Blobs;

/// Gaussian class blobs ([`crate::synthetic::classification`]'s), each example reshaped to `shape`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SyntheticSource {
    /// Number of examples.
    pub examples: usize,
    /// Number of classes (example `i` is of class `i % classes`).
    pub classes: usize,
    /// The shape of one example's features, e.g. `[3, 8, 8]`.
    pub shape: Vec<usize>,
    /// The seed of the centres and of every example's noise.
    pub seed: u64,
}

impl Default for SyntheticSource {
    fn default() -> Self {
        SyntheticSource {
            examples: 1000,
            classes: 10,
            shape: vec![32],
            seed: 0,
        }
    }
}

/// Token sequences of `len` ids below `vocab`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SyntheticTokens {
    /// Number of sequences.
    pub examples: usize,
    /// Tokens per sequence.
    pub len: usize,
    /// Ids are below this.
    pub vocab: usize,
    /// Number of classes (when not `next_token`).
    pub classes: usize,
    /// The seed.
    pub seed: u64,
    /// Language modelling ([`Task::NextToken`]: a seeded Markov chain in which every token has two likely
    /// successors) rather than classification (every class draws most of its tokens from its own few).
    pub next_token: bool,
}

impl Default for SyntheticTokens {
    fn default() -> Self {
        SyntheticTokens {
            examples: 1000,
            len: 32,
            vocab: 64,
            classes: 4,
            seed: 0,
            next_token: false,
        }
    }
}

/// The radius of the cube the blob centres are drawn from, in units of the noise's standard deviation.
const SPREAD: f64 = 2.0;

/// Class blobs, generated per example.
pub struct SyntheticExamples {
    opts: SyntheticSource,
    blobs: Blobs,
    labels: Vec<i32>,
    task: Task,
}

impl fmt::Debug for SyntheticExamples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyntheticExamples")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

fn class_names(classes: usize) -> Vec<String> {
    (0..classes).map(|c| c.to_string()).collect()
}

fn invalid(op: &'static str, reason: String) -> Error {
    Error::InvalidArgument { op, reason }
}

/// Gaussian class blobs: example `i` is of class `i % classes`, its features f32 `shape` a unit Gaussian around its
/// class's centre.
///
/// # Errors
/// [`Error::InvalidArgument`] for no classes or an empty shape product.
pub fn open(opts: &SyntheticSource) -> Result<SyntheticExamples> {
    const OP: &str = "synthetic::open";
    if opts.classes == 0 {
        return Err(invalid(OP, "0 classes; use at least 1".into()));
    }
    let features: usize = opts.shape.iter().product();
    if features == 0 {
        return Err(invalid(
            OP,
            format!("shape {:?} holds no features", opts.shape),
        ));
    }
    Ok(SyntheticExamples {
        blobs: Blobs::new(features, opts.classes, SPREAD, opts.seed),
        labels: (0..opts.examples)
            .map(|i| (i % opts.classes) as i32)
            .collect(),
        task: Task::Classify {
            classes: class_names(opts.classes),
        },
        opts: opts.clone(),
    })
}

fn check_index(op: &'static str, i: usize, len: usize) -> Result<()> {
    if i >= len {
        return Err(invalid(op, format!("example {i} of {len}")));
    }
    Ok(())
}

impl Examples for SyntheticExamples {
    fn len(&self) -> usize {
        self.opts.examples
    }

    fn shape(&self) -> &[usize] {
        &self.opts.shape
    }

    fn task(&self) -> &Task {
        &self.task
    }

    fn labels(&self) -> Option<&[i32]> {
        Some(&self.labels)
    }

    fn example(&self, i: usize) -> Result<(Array, Array)> {
        check_index("SyntheticExamples::example", i, self.len())?;
        let (x, c) = self.blobs.example(i as u64);
        Ok((Array::from_f32(x, &self.opts.shape)?, Array::scalar_i32(c)))
    }

    fn describe(&self) -> String {
        format!(
            "synthetic blobs ({} examples of {:?}, {} classes, seed {})",
            grouped(self.len()),
            self.opts.shape,
            self.opts.classes,
            self.opts.seed
        )
    }
}

/// Synthetic token sequences, generated per example.
pub struct SyntheticTokenExamples {
    opts: SyntheticTokens,
    shape: Vec<usize>,
    task: Task,
    labels: Option<Vec<i32>>,
    /// Classification: each class's preferred tokens, `per_class` of them in a row.
    preferred: Vec<u32>,
    per_class: usize,
    /// Next token: each token's two likely successors.
    successors: Vec<[u32; 2]>,
}

impl fmt::Debug for SyntheticTokenExamples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyntheticTokenExamples")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// How often a token is drawn from its class's preferred tokens (the rest are uniform over the vocabulary).
const PREFERRED: f64 = 0.6;
/// How often the next token is the first, or the second, likely successor (the rest are uniform).
const FIRST: f64 = 0.6;
const SECOND: f64 = 0.3;

/// Synthetic token sequences, ids f32 `[len]` below `vocab`.
///
/// Classification (`next_token` off): example `i` is of class `i % classes`; each token is, with probability 0.6,
/// one of its class's `max(1, vocab / (2 classes))` preferred tokens, else uniform, so a bag-of-tokens model learns
/// it. Language modelling (`next_token` on): a Markov chain in which every token is followed by its first likely
/// successor with probability 0.6, its second with 0.3, any token with 0.1; `y` is i32 `[len]`, the sequence
/// shifted by one ([`Task::NextToken`]).
///
/// # Errors
/// [`Error::InvalidArgument`] for an empty vocabulary, sequences of no tokens, or (classification) no classes.
pub fn open_tokens(opts: &SyntheticTokens) -> Result<SyntheticTokenExamples> {
    const OP: &str = "synthetic::open_tokens";
    if opts.vocab == 0 || opts.vocab > 1 << 24 {
        return Err(invalid(
            OP,
            format!(
                "a vocabulary of {} ids; use 1 to 2^24 (token ids must be exact in f32)",
                opts.vocab
            ),
        ));
    }
    if opts.len == 0 {
        return Err(invalid(OP, "sequences of 0 tokens; use at least 1".into()));
    }
    if !opts.next_token && opts.classes == 0 {
        return Err(invalid(OP, "0 classes; use at least 1".into()));
    }
    let mut rng = Rng::new(opts.seed);
    let vocab = opts.vocab as u64;
    let (task, labels, preferred, per_class, successors) = if opts.next_token {
        let successors = (0..vocab)
            .map(|_| [rng.below(vocab) as u32, rng.below(vocab) as u32])
            .collect();
        (
            Task::NextToken { vocab: opts.vocab },
            None,
            Vec::new(),
            0,
            successors,
        )
    } else {
        let mut order: Vec<u32> = (0..opts.vocab as u32).collect();
        rng.shuffle(&mut order);
        let per_class = (opts.vocab / (2 * opts.classes)).max(1);
        // Disjoint while the vocabulary allows, wrapping around (shared tokens) when it does not.
        let preferred = (0..opts.classes * per_class)
            .map(|k| order[k % order.len()])
            .collect();
        (
            Task::Classify {
                classes: class_names(opts.classes),
            },
            Some(
                (0..opts.examples)
                    .map(|i| (i % opts.classes) as i32)
                    .collect(),
            ),
            preferred,
            per_class,
            Vec::new(),
        )
    };
    Ok(SyntheticTokenExamples {
        shape: vec![opts.len],
        opts: opts.clone(),
        task,
        labels,
        preferred,
        per_class,
        successors,
    })
}

impl SyntheticTokenExamples {
    /// Example `i`'s tokens: `len` of them, or `len + 1` for next-token prediction.
    fn tokens(&self, i: usize) -> Vec<u32> {
        let mut rng = Rng::new(mix(self.opts.seed, i as u64));
        let vocab = self.opts.vocab as u64;
        if self.opts.next_token {
            let mut t = rng.below(vocab) as u32;
            let mut out = Vec::with_capacity(self.opts.len + 1);
            out.push(t);
            for _ in 0..self.opts.len {
                let u = rng.uniform();
                t = if u < FIRST {
                    self.successors[t as usize][0]
                } else if u < FIRST + SECOND {
                    self.successors[t as usize][1]
                } else {
                    rng.below(vocab) as u32
                };
                out.push(t);
            }
            out
        } else {
            let c = i % self.opts.classes;
            let mine = &self.preferred[c * self.per_class..(c + 1) * self.per_class];
            (0..self.opts.len)
                .map(|_| {
                    if rng.uniform() < PREFERRED {
                        mine[rng.below(mine.len() as u64) as usize]
                    } else {
                        rng.below(vocab) as u32
                    }
                })
                .collect()
        }
    }
}

impl Examples for SyntheticTokenExamples {
    // The number of sequences; `opts.len` is the tokens of one.
    #[allow(clippy::misnamed_getters)]
    fn len(&self) -> usize {
        self.opts.examples
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn task(&self) -> &Task {
        &self.task
    }

    fn labels(&self) -> Option<&[i32]> {
        self.labels.as_deref()
    }

    fn token_ids(&self) -> Option<usize> {
        Some(self.opts.vocab)
    }

    fn example(&self, i: usize) -> Result<(Array, Array)> {
        check_index("SyntheticTokenExamples::example", i, self.len())?;
        let tokens = self.tokens(i);
        let len = self.opts.len;
        let x = tokens[..len].iter().map(|&t| t as f32).collect();
        let y = match &self.labels {
            Some(l) => Array::scalar_i32(l[i]),
            None => Array::from_i32(tokens[1..].iter().map(|&t| t as i32).collect(), &self.shape)?,
        };
        Ok((Array::from_f32(x, &self.shape)?, y))
    }

    fn describe(&self) -> String {
        format!(
            "synthetic tokens ({} sequences of {} ids below {}, {}, seed {})",
            grouped(self.len()),
            self.opts.len,
            self.opts.vocab,
            if self.opts.next_token {
                "next token".to_string()
            } else {
                format!("{} classes", self.opts.classes)
            },
            self.opts.seed
        )
    }
}
