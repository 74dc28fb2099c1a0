//! A plain-text corpus for language modelling: the whole file as one stream of token ids, cut into windows whose
//! target is the same window shifted by one token.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::array::Array;
use crate::error::{Error, Result};
use crate::source::grouped;
use crate::source::{Examples, Task};
use crate::text::{Vocabulary, tokenize};

/// How a corpus is split into tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tokenizer {
    /// Every byte a token, its id the byte's value (256 ids, no vocabulary).
    Bytes,
    /// Every Unicode character a token (spaces and line breaks included), ids from a [`Vocabulary`].
    Chars,
    /// Lowercase words without surrounding punctuation ([`tokenize`]), ids from a [`Vocabulary`].
    Words,
}

impl Tokenizer {
    fn name(self) -> &'static str {
        match self {
            Tokenizer::Bytes => "bytes",
            Tokenizer::Chars => "chars",
            Tokenizer::Words => "words",
        }
    }
}

/// A corpus's token ids, read as non-overlapping windows: example `i` is `x = ids[i*w .. i*w + w]` and
/// `y = ids[i*w + 1 .. i*w + w + 1]` for window `w`.
pub struct TokenWindows {
    path: PathBuf,
    tokenizer: Tokenizer,
    ids: Ids,
    shape: Vec<usize>,
    task: Task,
    vocab: Option<Vocabulary>,
}

/// The id stream: bytes stay bytes (a quarter of the memory).
enum Ids {
    Bytes(Vec<u8>),
    Vocab(Vec<i32>),
}

impl Ids {
    fn len(&self) -> usize {
        match self {
            Ids::Bytes(b) => b.len(),
            Ids::Vocab(v) => v.len(),
        }
    }
}

impl fmt::Debug for TokenWindows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenWindows")
            .field("path", &self.path)
            .field("tokenizer", &self.tokenizer)
            .field("tokens", &self.ids.len())
            .field("window", &self.shape[0])
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

/// Read a corpus as next-token windows of `window` tokens.
///
/// With [`Tokenizer::Bytes`] the ids are the bytes (`Task::NextToken { vocab: 256 }`, no vocabulary). With
/// `Chars` or `Words` the ids come from `vocab` when given (the training corpus's, for a validation or test
/// corpus), otherwise from a vocabulary built over this corpus's tokens (kept when seen `min_count` times, at most
/// `max_vocab` ids; `0` is `<pad>`, `1` `<unk>`). `Bytes` uses neither `vocab` nor the two counts.
///
/// # Errors
/// [`Error::Io`] when the file cannot be read; [`Error::InvalidArgument`], naming the file, for a window of 0, a
/// corpus that is not UTF-8 (`chars`, `words`: the message gives the line and byte), or one shorter than one
/// window and its target (`window + 1` tokens; the message gives the token count).
pub fn open(
    path: &Path,
    tokenizer: Tokenizer,
    window: usize,
    vocab: Option<Vocabulary>,
    min_count: usize,
    max_vocab: usize,
) -> Result<TokenWindows> {
    let err = |reason: String| Error::InvalidArgument {
        op: "tokens::open",
        reason: format!("{}: {reason}", path.display()),
    };
    if window == 0 {
        return Err(err("a window of 0 tokens; use at least 1".into()));
    }
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let (ids, vocab) = match tokenizer {
        Tokenizer::Bytes => (Ids::Bytes(bytes), None),
        Tokenizer::Chars | Tokenizer::Words => {
            let text = String::from_utf8(bytes).map_err(|e| {
                let at = e.utf8_error().valid_up_to();
                let bytes = e.as_bytes();
                let line = 1 + bytes[..at].iter().filter(|&&b| b == b'\n').count();
                err(format!(
                    "not UTF-8 at byte {at} (line {line}); read it with the `bytes` tokenizer or convert it to UTF-8"
                ))
            })?;
            let (ids, vocab) = if tokenizer == Tokenizer::Chars {
                chars(&text, vocab, min_count, max_vocab)
            } else {
                words(&text, vocab, min_count, max_vocab)
            };
            (Ids::Vocab(ids), Some(vocab))
        }
    };
    if ids.len() < window + 1 {
        return Err(err(format!(
            "{} tokens ({}) is shorter than one window of {window} tokens and its next token ({} tokens); use \
             a smaller window or a longer corpus",
            ids.len(),
            tokenizer.name(),
            window + 1
        )));
    }
    let size = vocab.as_ref().map_or(256, Vocabulary::len);
    tracing::debug!(path = %path.display(), tokens = ids.len(), vocab = size, "read token corpus");
    Ok(TokenWindows {
        path: path.to_path_buf(),
        tokenizer,
        ids,
        shape: vec![window],
        task: Task::NextToken { vocab: size },
        vocab,
    })
}

fn chars(
    text: &str,
    vocab: Option<Vocabulary>,
    min_count: usize,
    max_vocab: usize,
) -> (Vec<i32>, Vocabulary) {
    let vocab = vocab.unwrap_or_else(|| {
        let mut counts: HashMap<char, usize> = HashMap::new();
        for c in text.chars() {
            *counts.entry(c).or_default() += 1;
        }
        let counts = counts
            .into_iter()
            .map(|(c, n)| (c.to_string(), n))
            .collect();
        Vocabulary::from_counts(counts, min_count, max_vocab)
    });
    // A char-keyed table: one lookup per character without building a String for each.
    let table: HashMap<char, i32> = (0..vocab.len() as i32)
        .filter_map(|id| {
            let t = vocab.token(id)?;
            let mut cs = t.chars();
            match (cs.next(), cs.next()) {
                (Some(c), None) => Some((c, id)),
                _ => None,
            }
        })
        .collect();
    let ids = text
        .chars()
        .map(|c| table.get(&c).copied().unwrap_or(Vocabulary::UNK))
        .collect();
    (ids, vocab)
}

fn words(
    text: &str,
    vocab: Option<Vocabulary>,
    min_count: usize,
    max_vocab: usize,
) -> (Vec<i32>, Vocabulary) {
    let tokens = tokenize(text);
    let vocab = vocab.unwrap_or_else(|| Vocabulary::build_tokens(&tokens, min_count, max_vocab));
    let ids = tokens.iter().map(|t| vocab.id(t)).collect();
    (ids, vocab)
}

impl TokenWindows {
    /// Every token id of the corpus, in order.
    pub fn ids(&self) -> Vec<i32> {
        match &self.ids {
            Ids::Bytes(b) => b.iter().map(|&v| i32::from(v)).collect(),
            Ids::Vocab(v) => v.clone(),
        }
    }
}

impl Examples for TokenWindows {
    fn len(&self) -> usize {
        (self.ids.len() - 1) / self.shape[0]
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn task(&self) -> &Task {
        &self.task
    }

    fn labels(&self) -> Option<&[i32]> {
        None
    }

    fn vocabulary(&self) -> Option<&Vocabulary> {
        self.vocab.as_ref()
    }

    fn token_ids(&self) -> Option<usize> {
        Some(self.task.outputs())
    }

    fn example(&self, i: usize) -> Result<(Array, Array)> {
        if i >= self.len() {
            return Err(Error::InvalidArgument {
                op: "TokenWindows::example",
                reason: format!(
                    "window {i} of {} which has {}",
                    self.path.display(),
                    self.len()
                ),
            });
        }
        let w = self.shape[0];
        let span = i * w..i * w + w + 1;
        let ids: Vec<i32> = match &self.ids {
            Ids::Bytes(b) => b[span].iter().map(|&v| i32::from(v)).collect(),
            Ids::Vocab(v) => v[span].to_vec(),
        };
        let x = ids[..w].iter().map(|&t| t as f32).collect();
        Ok((
            Array::from_f32(x, &self.shape)?,
            Array::from_i32(ids[1..].to_vec(), &self.shape)?,
        ))
    }

    fn describe(&self) -> String {
        format!(
            "tokens {} ({} {} tokens, vocabulary {}, {} windows of {})",
            self.path.display(),
            grouped(self.ids.len()),
            self.tokenizer.name(),
            grouped(self.task.outputs()),
            grouped(self.len()),
            self.shape[0]
        )
    }
}
