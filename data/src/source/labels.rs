//! Class labels read as names (a CSV label column, the labels of labelled text), made class ids once all are read.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::source::list;

/// Class labels read as text, one per example, turned into class ids once all are read. Shared by the sources
/// whose labels are names (CSV label columns, labelled text).
pub(crate) struct LabelCells {
    column: usize,
    index: HashMap<Vec<u8>, u32>,
    /// Distinct labels in order of first appearance, with the line they first appear on.
    seen: Vec<(String, usize)>,
    rows: Vec<u32>,
}

impl LabelCells {
    /// Labels of the 1-based `column` (named in errors).
    pub(crate) fn new(column: usize) -> Self {
        LabelCells {
            column,
            index: HashMap::new(),
            seen: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// The next example's label, read on `line`.
    pub(crate) fn push(&mut self, label: &[u8], line: usize) {
        let id = match self.index.get(label) {
            Some(&id) => id,
            None => {
                let id = self.seen.len() as u32;
                self.index.insert(label.to_vec(), id);
                self.seen
                    .push((String::from_utf8_lossy(label).into_owned(), line));
                id
            }
        };
        self.rows.push(id);
    }

    /// Add the labels of `later`, read after these.
    pub(crate) fn append(&mut self, later: LabelCells) {
        let ids: Vec<u32> = later
            .seen
            .into_iter()
            .map(|(name, line)| match self.index.get(name.as_bytes()) {
                Some(&id) => id,
                None => {
                    let id = self.seen.len() as u32;
                    self.index.insert(name.as_bytes().to_vec(), id);
                    self.seen.push((name, line));
                    id
                }
            })
            .collect();
        self.rows
            .extend(later.rows.into_iter().map(|r| ids[r as usize]));
    }

    /// The class names in id order and every example's class id: `classes` when given, else the distinct labels
    /// sorted (numerically when all are integers).
    ///
    /// # Errors
    /// [`Error::Csv`] naming the first line of a label that is not in `classes`.
    pub(crate) fn finish(
        self,
        path: &Path,
        classes: Option<&[String]>,
    ) -> Result<(Vec<String>, Vec<i32>)> {
        let classes: Vec<String> = match classes {
            Some(known) => known.to_vec(),
            None => {
                let mut names: Vec<String> = self.seen.iter().map(|(n, _)| n.clone()).collect();
                let ints: Option<Vec<i64>> = names.iter().map(|n| n.parse().ok()).collect();
                match ints {
                    Some(mut keyed) => {
                        let mut order: Vec<usize> = (0..names.len()).collect();
                        order.sort_by_key(|&i| keyed[i]);
                        keyed.clear();
                        names = order.into_iter().map(|i| names[i].clone()).collect();
                    }
                    None => names.sort(),
                }
                names
            }
        };
        let position: HashMap<&str, i32> = classes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.as_str(), i as i32))
            .collect();
        let mut map = Vec::with_capacity(self.seen.len());
        for (name, line) in &self.seen {
            match position.get(name.as_str()) {
                Some(&id) => map.push(id),
                None => {
                    return Err(Error::Csv {
                        path: path.to_path_buf(),
                        line: *line,
                        column: self.column,
                        reason: format!(
                            "label {name:?} is not one of the {} known classes {} (a validation or test file may only \
                             hold the training file's classes)",
                            classes.len(),
                            list(&classes)
                        ),
                    });
                }
            }
        }
        let ids = self.rows.iter().map(|&r| map[r as usize]).collect();
        Ok((classes, ids))
    }
}
