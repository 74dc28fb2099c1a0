//! Labelled text: one example per `label<TAB>text` line, features the text's token ids under a [`Vocabulary`].
//!
//! The vocabulary is not built when the file is opened: it must come from the training split alone (the caller
//! builds it over the training indices' [`texts`](TextExamples::texts) and hands it to every split with
//! [`with_vocabulary`](TextExamples::with_vocabulary)).

use std::fmt;
use std::path::{Path, PathBuf};

use crate::array::Array;
use crate::error::{Error, Result};
use crate::source::{Examples, Task};
use crate::source::{LabelCells, grouped};
use crate::text::Vocabulary;

/// The lines of a `label<TAB>text` file: texts, their class ids, and once set, the vocabulary that encodes them.
pub struct TextExamples {
    path: PathBuf,
    texts: Vec<String>,
    labels: Vec<i32>,
    task: Task,
    vocab: Option<Vocabulary>,
    shape: Vec<usize>,
}

impl fmt::Debug for TextExamples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextExamples")
            .field("path", &self.path)
            .field("lines", &self.texts.len())
            .field("task", &self.task)
            .field("vocabulary", &self.vocab.as_ref().map(Vocabulary::len))
            .field("shape", &self.shape)
            .finish()
    }
}

/// Read a `label<TAB>text` file (labels are names, e.g. `0`, `spam`; the text runs to the end of the line). Blank
/// lines are skipped. `classes` fixes the class list (the training file's, for its validation or test file);
/// without it the classes are the sorted distinct labels, numerically sorted when all are integers.
///
/// # Errors
/// [`Error::Io`] when the file cannot be read; [`Error::Csv`] naming the line of a line without a tab, an empty
/// label, or a label outside `classes`.
pub fn open(path: &Path, classes: Option<&[String]>) -> Result<TextExamples> {
    let content = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut cells = LabelCells::new(1);
    let mut texts = Vec::new();
    for (i, line) in content.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| Error::Csv {
            path: path.to_path_buf(),
            line: i + 1,
            column: 1,
            reason,
        };
        let Some((label, text)) = line.split_once('\t') else {
            return Err(bad(format!(
                "no tab in {:?}: every line must be `label<TAB>text`",
                short(line)
            )));
        };
        let label = label.trim();
        if label.is_empty() {
            return Err(bad(
                "empty label: every line must be `label<TAB>text`".into()
            ));
        }
        cells.push(label.as_bytes(), i + 1);
        texts.push(text.trim().to_string());
    }
    let (classes, labels) = cells.finish(path, classes)?;
    Ok(TextExamples {
        path: path.to_path_buf(),
        texts,
        labels,
        task: Task::Classify { classes },
        vocab: None,
        shape: Vec::new(),
    })
}

/// The start of a long line, for a message.
fn short(line: &str) -> String {
    match line.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line.to_string(),
    }
}

impl TextExamples {
    /// The texts, in line order (blank lines left out).
    pub fn texts(&self) -> &[String] {
        &self.texts
    }

    /// Encode with `vocab`: features become the text's token ids ([`Vocabulary::encode`]) cut to `max_len` and
    /// padded with [`Vocabulary::PAD`], f32 `[max_len]`.
    #[must_use]
    pub fn with_vocabulary(self, vocab: Vocabulary, max_len: usize) -> TextExamples {
        TextExamples {
            vocab: Some(vocab),
            shape: vec![max_len],
            ..self
        }
    }
}

impl Examples for TextExamples {
    fn len(&self) -> usize {
        self.texts.len()
    }

    /// `[max_len]` once a vocabulary is set, `[]` before.
    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn task(&self) -> &Task {
        &self.task
    }

    fn labels(&self) -> Option<&[i32]> {
        Some(&self.labels)
    }

    fn vocabulary(&self) -> Option<&Vocabulary> {
        self.vocab.as_ref()
    }

    fn example(&self, i: usize) -> Result<(Array, Array)> {
        let Some(vocab) = &self.vocab else {
            return Err(Error::InvalidArgument {
                op: "TextExamples::example",
                reason: format!(
                    "{}: no vocabulary yet; build one on the training split (Vocabulary::build) and set it with \
                     with_vocabulary(vocab, max_len)",
                    self.path.display()
                ),
            });
        };
        let Some(text) = self.texts.get(i) else {
            return Err(Error::InvalidArgument {
                op: "TextExamples::example",
                reason: format!(
                    "line {i} of {} which has {}",
                    self.path.display(),
                    self.len()
                ),
            });
        };
        let max_len = self.shape[0];
        let ids = vocab.encode(text, max_len);
        let mut x: Vec<f32> = ids
            .as_i32()
            .unwrap_or_default()
            .iter()
            .map(|&t| t as f32)
            .collect();
        x.resize(max_len, Vocabulary::PAD as f32);
        Ok((
            Array::from_f32(x, &self.shape)?,
            Array::scalar_i32(self.labels[i]),
        ))
    }

    fn describe(&self) -> String {
        format!(
            "text {} ({} classes, {} lines{})",
            self.path.display(),
            self.task.outputs(),
            grouped(self.len()),
            match &self.vocab {
                Some(v) => format!(", {} tokens, {} ids each", grouped(v.len()), self.shape[0]),
                None => String::new(),
            }
        )
    }
}
