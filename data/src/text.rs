//! Text: lines of a file, a whitespace tokenizer, and a vocabulary that maps tokens to ids (labelled text and token
//! corpora built on them are sources: [`crate::source::text`], [`crate::source::tokens`]).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;

use crate::array::Array;
use crate::dataset::Dataset;
use crate::error::Error;

/// Split text into lowercase tokens at whitespace, trimming ASCII punctuation at both ends of each token.
pub fn tokenize(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| c.is_ascii_punctuation())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// The lines of a text file, read lazily on each pass (trailing `\r` removed).
pub fn text_lines(path: impl AsRef<Path>) -> Dataset<String> {
    let path = path.as_ref().to_path_buf();
    let name = path.display().to_string();
    Dataset::from_iter_fn(name, move || {
        let p = path.clone();
        let file = std::fs::File::open(&p).map_err(|e| Error::io(&p, e))?;
        Ok(BufReader::new(file).lines().map(move |l| {
            l.map(|s| s.trim_end_matches('\r').to_string())
                .map_err(|e| Error::io(&p, e))
        }))
    })
}

/// A mapping from tokens to ids: `0` is padding (`<pad>`), `1` unknown (`<unk>`), then tokens by decreasing
/// frequency (ties alphabetical, so the same corpus always gives the same ids). Serializable, to be saved with a
/// model.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Vocabulary {
    tokens: Vec<String>,
    #[serde(skip)]
    ids: HashMap<String, i32>,
}

impl Vocabulary {
    /// Id of the padding token.
    pub const PAD: i32 = 0;
    /// Id of tokens not in the vocabulary.
    pub const UNK: i32 = 1;

    /// Count the tokens of `texts` and keep those seen at least `min_count` times, at most `max_size` ids in all
    /// (counting `<pad>` and `<unk>`).
    pub fn build<'a>(
        texts: impl IntoIterator<Item = &'a str>,
        min_count: usize,
        max_size: usize,
    ) -> Self {
        Self::build_tokens(texts.into_iter().flat_map(tokenize), min_count, max_size)
    }

    /// As [`build`](Vocabulary::build), over tokens already split (characters of a corpus, a tokenizer's output):
    /// every item is one token.
    pub fn build_tokens<S: AsRef<str>>(
        tokens: impl IntoIterator<Item = S>,
        min_count: usize,
        max_size: usize,
    ) -> Self {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for tok in tokens {
            let tok = tok.as_ref();
            match counts.get_mut(tok) {
                Some(c) => *c += 1,
                None => {
                    counts.insert(tok.to_string(), 1);
                }
            }
        }
        Self::from_counts(counts, min_count, max_size)
    }

    /// A vocabulary of counted tokens: `<pad>`, `<unk>`, then the tokens seen at least `min_count` times by
    /// decreasing count (ties alphabetical), at most `max_size` ids in all.
    pub fn from_counts(counts: HashMap<String, usize>, min_count: usize, max_size: usize) -> Self {
        let mut by_freq: Vec<(String, usize)> = counts
            .into_iter()
            .filter(|(_, c)| *c >= min_count.max(1))
            .collect();
        by_freq.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut tokens = vec!["<pad>".to_string(), "<unk>".to_string()];
        tokens.extend(
            by_freq
                .into_iter()
                .map(|(t, _)| t)
                .take(max_size.saturating_sub(2)),
        );
        Self::from_tokens(tokens)
    }

    /// A vocabulary whose ids are the positions of `tokens` (which should start with `<pad>`, `<unk>`).
    pub fn from_tokens(tokens: Vec<String>) -> Self {
        let ids = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as i32))
            .collect();
        Vocabulary { tokens, ids }
    }

    /// Rebuild the lookup table after deserializing.
    pub fn reindexed(self) -> Self {
        Self::from_tokens(self.tokens)
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether it holds no token at all.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The id of a token (`UNK` when absent).
    pub fn id(&self, token: &str) -> i32 {
        if self.ids.is_empty() && !self.tokens.is_empty() {
            return self
                .tokens
                .iter()
                .position(|t| t == token)
                .map_or(Self::UNK, |i| i as i32);
        }
        self.ids.get(token).copied().unwrap_or(Self::UNK)
    }

    /// The token of an id.
    pub fn token(&self, id: i32) -> Option<&str> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.tokens.get(i))
            .map(String::as_str)
    }

    /// Tokenize and look up `text`, cut to at most `max_len` ids: an `i32` array `[len]`.
    pub fn encode(&self, text: &str, max_len: usize) -> Array {
        let ids: Vec<i32> = tokenize(text)
            .iter()
            .take(max_len)
            .map(|t| self.id(t))
            .collect();
        let n = ids.len();
        Array::from_i32(ids, &[n]).unwrap_or_else(|_| Array::scalar_i32(Self::UNK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_and_vocabulary() {
        assert_eq!(
            tokenize("Hello, world!  The END."),
            vec!["hello", "world", "the", "end"]
        );
        let v = Vocabulary::build(["a b b c", "b c d"], 2, 100);
        assert_eq!(v.token(0), Some("<pad>"));
        assert_eq!(v.id("b"), 2, "most frequent first");
        assert_eq!(v.id("c"), 3);
        assert_eq!(v.id("a"), Vocabulary::UNK, "below min_count");
        assert_eq!(v.encode("b zzz c b", 3).as_i32().unwrap(), &[2, 1, 3]);
        let json = serde_json::to_string(&v).unwrap();
        let back: Vocabulary = serde_json::from_str::<Vocabulary>(&json)
            .unwrap()
            .reindexed();
        assert_eq!(back, v);
    }

    #[test]
    fn lines_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        std::fs::write(&p, "one\ntwo\n\nthree\n").unwrap();
        let lines: Vec<String> = text_lines(&p).iter().map(|l| l.unwrap()).collect();
        assert_eq!(lines, ["one", "two", "", "three"]);
        assert!(
            text_lines(dir.path().join("none"))
                .iter()
                .next()
                .unwrap()
                .is_err()
        );
    }
}
