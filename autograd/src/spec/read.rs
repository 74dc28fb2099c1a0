//! Reading a spec from TOML by hand, so that every error names the key and what is accepted.

use std::cell::RefCell;

use toml::{Table, Value};

/// A spec that cannot be read as written: the dotted key (`layers[2].kernel`) and what is accepted there.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("key \"{key}\": {message}")]
pub struct SpecError {
    /// Where, as a dotted path from the spec's root; empty for the whole spec.
    pub key: String,
    /// What is wrong and what is accepted.
    pub message: String,
}

/// `Result` of reading a spec.
pub type SpecResult<T> = std::result::Result<T, SpecError>;

/// A table being read: remembers which keys were asked for, so that [`Fields::finish`] can report any other key
/// with the ones accepted.
#[derive(Debug)]
pub struct Fields<'a> {
    table: &'a Table,
    prefix: String,
    grid: bool,
    used: RefCell<Vec<String>>,
}

/// A human name for a TOML value's type (and the value, when short).
pub fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Integer(i) => format!("the integer {i}"),
        Value::Float(f) => format!("the number {f}"),
        Value::Boolean(b) => format!("{b}"),
        Value::Datetime(d) => format!("the date {d}"),
        Value::Array(_) => "a list".into(),
        Value::Table(_) => "a table".into(),
    }
}

impl<'a> Fields<'a> {
    /// Reads `table`, found at the dotted key `prefix`. With `grid`, messages say that a list of values was also
    /// accepted (a hyper-parameter grid, expanded before reading).
    pub fn new(table: &'a Table, prefix: &str, grid: bool) -> Fields<'a> {
        Fields {
            table,
            prefix: prefix.to_string(),
            grid,
            used: RefCell::default(),
        }
    }

    /// The table read.
    pub fn table(&self) -> &'a Table {
        self.table
    }

    /// The dotted path of `k`.
    pub fn key(&self, k: &str) -> String {
        match (self.prefix.is_empty(), k.is_empty()) {
            (true, _) => k.to_string(),
            (false, true) => self.prefix.clone(),
            (false, false) if k.starts_with('[') => format!("{}{k}", self.prefix),
            (false, false) => format!("{}.{k}", self.prefix),
        }
    }

    /// An error at `k` (empty: the table itself).
    pub fn error(&self, k: &str, message: impl Into<String>) -> SpecError {
        SpecError {
            key: self.key(k),
            message: message.into(),
        }
    }

    /// The table at `k` (a sub-table, or an element of a list when `k` is `[i]`), read with the same settings.
    pub fn sub(&self, k: &str, table: &'a Table) -> Fields<'a> {
        Fields::new(table, &self.key(k), self.grid)
    }

    /// The raw value of `k`, marking it as known.
    pub fn take(&self, k: &str) -> Option<&'a Value> {
        self.used.borrow_mut().push(k.to_string());
        self.table.get(k)
    }

    /// `what`, and a list of them where a grid may give one (`plural` names the list).
    fn expected(&self, what: &str, plural: &str) -> String {
        if self.grid {
            format!("{what} or {plural}")
        } else {
            what.to_string()
        }
    }

    /// A string, one of `accepted` (the message lists them).
    ///
    /// # Errors
    /// When the value is not a string.
    pub fn str(&self, k: &str, accepted: &str) -> SpecResult<Option<&'a str>> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.error(k, format!("expected {accepted}, found {}", describe(v)))),
        }
    }

    /// `true` or `false`.
    ///
    /// # Errors
    /// When the value is not a boolean.
    pub fn bool(&self, k: &str) -> SpecResult<Option<bool>> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::Boolean(b)) => Ok(Some(*b)),
            Some(v) => Err(self.error(k, format!("expected true or false, found {}", describe(v)))),
        }
    }

    /// A finite number (an integer is accepted).
    ///
    /// # Errors
    /// When the value is not a number.
    pub fn f64(&self, k: &str) -> SpecResult<Option<f64>> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::Float(f)) if f.is_finite() => Ok(Some(*f)),
            Some(Value::Integer(i)) => Ok(Some(*i as f64)),
            Some(v) => Err(self.error(
                k,
                format!(
                    "expected {}, found {}",
                    self.expected("a number", "a list of numbers"),
                    describe(v)
                ),
            )),
        }
    }

    /// A number in `[lo, hi]`; `what` says what it is for the message (`"a rate in [0, 1)"`).
    ///
    /// # Errors
    /// When the value is not a number in range.
    pub fn f64_in(&self, k: &str, lo: f64, hi: f64, what: &str) -> SpecResult<Option<f64>> {
        match self.f64(k)? {
            Some(v) if !(lo..=hi).contains(&v) => {
                Err(self.error(k, format!("expected {what}, found {v}")))
            }
            v => Ok(v),
        }
    }

    /// An integer of at least `min`.
    ///
    /// # Errors
    /// When the value is not such an integer.
    pub fn u64(&self, k: &str, min: u64) -> SpecResult<Option<u64>> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::Integer(i)) if *i >= 0 && *i as u64 >= min => Ok(Some(*i as u64)),
            Some(v) => Err(self.error(
                k,
                format!(
                    "expected {}, found {}",
                    self.expected(&format!("an integer ≥ {min}"), "a list of them"),
                    describe(v)
                ),
            )),
        }
    }

    /// As [`Fields::u64`], as a `usize`.
    ///
    /// # Errors
    /// When the value is not such an integer.
    pub fn usize(&self, k: &str, min: usize) -> SpecResult<Option<usize>> {
        Ok(self.u64(k, min as u64)?.map(|v| v as usize))
    }

    /// `true`: a layer kind without a size, such as `{ flatten = true }`.
    ///
    /// # Errors
    /// When the value is anything but `true`.
    pub fn flag(&self, k: &str) -> SpecResult<()> {
        match self.bool(k)? {
            Some(true) => Ok(()),
            _ => Err(self.error(k, "expected true (leave the layer out otherwise)")),
        }
    }

    /// A single-key table such as `{ adam = { lr = 1e-3 } }` or `{ idx = "DIR" }`, or a bare string standing for
    /// its key with an empty table (`"adam"`): the key and its value. `accepted` names the keys for the message.
    ///
    /// # Errors
    /// When the value is neither.
    pub fn variant(&self, k: &str, accepted: &str) -> SpecResult<Option<(&'a str, &'a Value)>> {
        static EMPTY: std::sync::LazyLock<Value> =
            std::sync::LazyLock::new(|| Value::Table(Table::new()));
        match self.take(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some((s.as_str(), &*EMPTY))),
            Some(Value::Table(t)) if t.len() == 1 => {
                let (name, v) = t.iter().next().expect("one entry");
                Ok(Some((name.as_str(), v)))
            }
            Some(v) => Err(self.error(
                k,
                format!(
                    "expected a table with one of {accepted}, found {}",
                    describe(v)
                ),
            )),
        }
    }

    /// Fails on keys that were never asked for, listing the accepted ones.
    ///
    /// # Errors
    /// On the first unknown key.
    pub fn finish(&self) -> SpecResult<()> {
        let used = self.used.borrow();
        if let Some(k) = self.table.keys().find(|k| !used.contains(k)) {
            let mut accepted: Vec<&str> = used.iter().map(String::as_str).collect();
            accepted.sort_unstable();
            accepted.dedup();
            return Err(self.error(
                k,
                format!("unknown key; accepted here: {}", accepted.join(", ")),
            ));
        }
        Ok(())
    }
}
