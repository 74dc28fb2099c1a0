//! Progress display: one redrawn line per member in a terminal, plain log lines otherwise.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// What one member's line shows.
#[derive(Debug, Clone, Default)]
pub struct MemberStatus {
    /// Member name.
    pub name: String,
    /// Steps taken.
    pub step: u64,
    /// Steps it will take in total.
    pub total_steps: u64,
    /// Current epoch (1-based) and epochs in total.
    pub epoch: (u64, u64),
    /// Recent mean loss.
    pub loss: f64,
    /// Recent steps per second.
    pub steps_per_s: f64,
    /// Bytes its tenant holds.
    pub mem_bytes: u64,
    /// The latest evaluation's headline: `val acc 0.9712`.
    pub scores: Option<String>,
    /// A note: paused, fused with …, moved to CPU, done.
    pub note: String,
}

/// The progress display.
#[derive(Debug)]
pub struct Progress {
    tty: bool,
    enabled: bool,
    lines: Vec<MemberStatus>,
    drawn: usize,
    last_draw: Option<Instant>,
    last_plain: Vec<Option<Instant>>,
    plain_every: Duration,
}

fn bar(frac: f64, width: usize) -> String {
    let filled = ((frac.clamp(0.0, 1.0)) * width as f64).round() as usize;
    let mut s = "█".repeat(filled);
    s.push_str(&"░".repeat(width - filled));
    s
}

impl Progress {
    /// A display for `names`; redraws in place when stderr is a terminal. `enabled = false` prints nothing.
    pub fn new(names: &[String], enabled: bool) -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            enabled,
            lines: names
                .iter()
                .map(|n| MemberStatus {
                    name: n.clone(),
                    ..Default::default()
                })
                .collect(),
            drawn: 0,
            last_draw: None,
            last_plain: vec![None; names.len()],
            plain_every: Duration::from_secs(5),
        }
    }

    /// Formats one member's line.
    pub fn line(s: &MemberStatus, name_width: usize) -> String {
        let frac = if s.total_steps == 0 {
            0.0
        } else {
            s.step as f64 / s.total_steps as f64
        };
        let mut l = format!(
            "  {:<name_width$}  {}  step {}/{}  epoch {}/{}  loss {:.4}  {} steps/s  mem {}",
            s.name,
            bar(frac, 20),
            crate::report::thousands(s.step),
            crate::report::thousands(s.total_steps),
            s.epoch.0,
            s.epoch.1,
            s.loss,
            crate::report::thousands(s.steps_per_s.round() as u64),
            crate::report::bytes(s.mem_bytes)
        );
        for extra in s
            .scores
            .iter()
            .chain(Some(&s.note).filter(|n| !n.is_empty()))
        {
            l.push_str("  ");
            l.push_str(extra);
        }
        l
    }

    /// Updates member `i`'s line; redraws at most 10 times a second (terminal) or prints a plain line every few
    /// seconds per member (not a terminal).
    pub fn update(&mut self, i: usize, status: MemberStatus) {
        self.lines[i] = status;
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if self.tty {
            if self
                .last_draw
                .is_none_or(|t| now.duration_since(t) >= Duration::from_millis(100))
            {
                self.redraw();
                self.last_draw = Some(now);
            }
        } else if self.last_plain[i].is_none_or(|t| now.duration_since(t) >= self.plain_every) {
            self.last_plain[i] = Some(now);
            let w = self.name_width();
            eprintln!("{}", Self::line(&self.lines[i], w).trim_start());
        }
    }

    fn name_width(&self) -> usize {
        self.lines.iter().map(|l| l.name.len()).max().unwrap_or(0)
    }

    fn redraw(&mut self) {
        let w = self.name_width();
        let mut err = std::io::stderr().lock();
        if self.drawn > 0 {
            let _ = write!(err, "\x1b[{}A", self.drawn);
        }
        // Lines longer than the terminal would wrap and break the cursor movements: cut them.
        let cols = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
            .unwrap_or(160);
        for l in &self.lines {
            let line: String = Self::line(l, w)
                .chars()
                .take(cols.saturating_sub(1))
                .collect();
            let _ = writeln!(err, "\x1b[2K{line}");
        }
        self.drawn = self.lines.len();
        let _ = err.flush();
    }

    /// Prints a message (an OOM event, a control change) above the member lines.
    pub fn message(&mut self, text: &str) {
        if !self.enabled {
            return;
        }
        if self.tty && self.drawn > 0 {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\x1b[{}A", self.drawn);
            for _ in 0..self.drawn {
                let _ = writeln!(err, "\x1b[2K");
            }
            let _ = write!(err, "\x1b[{}A", self.drawn);
            let _ = writeln!(err, "{text}");
            drop(err);
            self.drawn = 0;
            self.redraw();
        } else {
            eprintln!("{text}");
        }
    }

    /// Draws the final state of every line.
    pub fn finish(&mut self) {
        if !self.enabled {
            return;
        }
        if self.tty {
            self.redraw();
        } else {
            let w = self.name_width();
            for l in &self.lines {
                eprintln!("{}", Self::line(l, w).trim_start());
            }
        }
    }
}
