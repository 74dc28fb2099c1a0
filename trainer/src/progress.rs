//! Progress display: in a terminal, one bar per member (indicatif: redrawn in place at the terminal's real width,
//! with elapsed time and an ETA, in colour unless `NO_COLOR` is set); otherwise plain lines, one per member every
//! few seconds, that a log file or CI keeps readable. For a sweep ([`Progress::only_active`]) only the trials that
//! train have a line: a trial gets its bar when it starts, and when it ends the bar gives way to one printed line
//! of how it ended, so that 64 trials fit a terminal.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

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
    /// It trains (or is paused) now: neither waiting to start nor ended.
    pub active: bool,
}

impl MemberStatus {
    /// What follows the bar, the most telling first (a narrow terminal cuts the end): epoch, loss, the latest
    /// scores, speed, memory and the note.
    fn detail(&self) -> String {
        let mut l = format!(
            "epoch {}/{}  loss {:.4}",
            self.epoch.0, self.epoch.1, self.loss
        );
        if let Some(s) = &self.scores {
            l.push_str("  ");
            l.push_str(s);
        }
        l.push_str(&format!(
            "  {} steps/s  mem {}",
            crate::report::thousands(self.steps_per_s.round() as u64),
            crate::report::bytes(self.mem_bytes)
        ));
        if !self.note.is_empty() {
            l.push_str("  ");
            l.push_str(&self.note);
        }
        l
    }

    /// Seconds left at the recent speed, when it can be told.
    fn eta(&self) -> Option<f64> {
        let left = self.total_steps.saturating_sub(self.step);
        (self.steps_per_s > 0.0 && left > 0).then(|| left as f64 / self.steps_per_s)
    }
}

/// `1:02:03`, `2:03`.
pub fn clock(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, m, s) => format!("{m}:{s:02}"),
        (h, m, s) => format!("{h}:{m:02}:{s:02}"),
    }
}

/// Where the lines go.
#[derive(Debug)]
enum Display {
    /// Nothing is shown.
    Off,
    /// A terminal: one bar per member, shown once the run begins ([`Progress::begin`]), so that what is printed
    /// before (the run's description) stays above them.
    Bars {
        multi: MultiProgress,
        bars: Vec<ProgressBar>,
        live: bool,
    },
    /// A log: a plain line per member every few seconds.
    Plain { last: Vec<Option<Instant>> },
}

/// The progress display.
#[derive(Debug)]
pub struct Progress {
    display: Display,
    lines: Vec<MemberStatus>,
    name_width: usize,
    started: Instant,
    /// Lines only for active members ([`Progress::only_active`]).
    only_active: bool,
    /// Per member: its bar is on screen; its end was printed.
    shown: Vec<bool>,
    ended: Vec<bool>,
}

/// Seconds between one member's plain lines.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

impl Progress {
    /// A display for `names`: bars when stderr is a terminal, plain lines otherwise; `enabled = false` shows
    /// nothing.
    pub fn new(names: &[String], enabled: bool) -> Progress {
        if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
            console::set_colors_enabled_stderr(false);
        }
        let name_width = names.iter().map(String::len).max().unwrap_or(0);
        let display = match (enabled, std::io::stderr().is_terminal()) {
            (false, _) => Display::Off,
            (true, false) => Display::Plain {
                last: vec![None; names.len()],
            },
            (true, true) => {
                let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
                let style = ProgressStyle::with_template(&format!(
                    "  {{prefix:<{name_width}.bold}}  {{bar:20.cyan/blue}}  step {{human_pos}}/{{human_len}}  \
                     {{elapsed:>5}} ETA {{eta:>5}}  {{wide_msg}}"
                ))
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("█▉▊▋▌▍▎▏░");
                let bars = names
                    .iter()
                    .map(|n| {
                        // Hidden until the multi-bar takes it: a bar's own target would draw it at once.
                        let b =
                            ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden())
                                .with_style(style.clone());
                        b.set_prefix(n.clone());
                        b
                    })
                    .collect();
                Display::Bars {
                    multi,
                    bars,
                    live: false,
                }
            }
        };
        Progress {
            display,
            lines: names
                .iter()
                .map(|n| MemberStatus {
                    name: n.clone(),
                    ..Default::default()
                })
                .collect(),
            name_width,
            started: Instant::now(),
            only_active: false,
            shown: vec![false; names.len()],
            ended: vec![false; names.len()],
        }
    }

    /// Shows only the members that train now (a sweep's trials): one line each while they do, and one printed line
    /// when each ends.
    pub fn only_active(mut self) -> Progress {
        self.only_active = true;
        self
    }

    /// One member's plain line: name, steps, the detail, elapsed time and ETA.
    pub fn line(s: &MemberStatus, name_width: usize, elapsed: f64) -> String {
        format!(
            "{:<name_width$}  step {}/{}  {}  {} elapsed{}",
            s.name,
            crate::report::thousands(s.step),
            crate::report::thousands(s.total_steps),
            s.detail(),
            clock(elapsed),
            s.eta()
                .map_or(String::new(), |e| format!(", ETA {}", clock(e)))
        )
    }

    /// Updates member `i`'s line (a terminal redraws at most 10 times a second; a log gets a line every few
    /// seconds per member).
    pub fn update(&mut self, i: usize, status: MemberStatus) {
        if self.only_active && !status.active {
            // A trial that waits has no line; one that ended gets its last line printed once, its bar removed.
            let ended = status.step > 0 || !status.note.starts_with("queued");
            if ended && !self.ended[i] {
                self.ended[i] = true;
                if let Display::Bars { multi, bars, .. } = &self.display
                    && self.shown[i]
                {
                    multi.remove(&bars[i]);
                }
                self.shown[i] = false;
                let elapsed = self.started.elapsed().as_secs_f64();
                let line = Self::line(&status, self.name_width, elapsed);
                if !matches!(self.display, Display::Off) {
                    self.message(&line);
                }
            }
            self.lines[i] = status;
            return;
        }
        match &mut self.display {
            Display::Off => {}
            Display::Bars { multi, bars, live } => {
                let b = &bars[i];
                if self.only_active && *live && !self.shown[i] {
                    multi.add(b.clone());
                    self.shown[i] = true;
                }
                b.set_length(status.total_steps);
                b.set_position(status.step);
                b.set_message(status.detail());
            }
            Display::Plain { last } => {
                let now = Instant::now();
                if last[i].is_none_or(|t| now.duration_since(t) >= PLAIN_EVERY) {
                    last[i] = Some(now);
                    let elapsed = self.started.elapsed().as_secs_f64();
                    eprintln!("{}", Self::line(&status, self.name_width, elapsed));
                }
            }
        }
        self.lines[i] = status;
    }

    /// Shows the bars, in the members' order, from now on (a terminal; nothing to do for a log).
    pub fn begin(&mut self) {
        if let Display::Bars { multi, bars, live } = &mut self.display
            && !*live
        {
            *live = true;
            for (i, b) in bars.iter().enumerate() {
                if !self.only_active || self.lines[i].active {
                    multi.add(b.clone());
                    self.shown[i] = true;
                }
            }
        }
    }

    /// Prints a message (an OOM event, a control change) above the member lines.
    pub fn message(&mut self, text: &str) {
        match &self.display {
            Display::Off => {}
            Display::Bars { multi, .. } => {
                if multi.println(text).is_err() {
                    eprintln!("{text}");
                }
            }
            Display::Plain { .. } => eprintln!("{text}"),
        }
    }

    /// Draws the final state of every line.
    pub fn finish(&mut self) {
        match &self.display {
            Display::Off => {}
            Display::Bars { bars, .. } => {
                for ((b, s), shown) in bars.iter().zip(&self.lines).zip(&self.shown) {
                    if !self.only_active || *shown {
                        b.set_position(s.step);
                        b.set_message(s.detail());
                        b.abandon();
                    }
                }
            }
            Display::Plain { .. } => {
                let elapsed = self.started.elapsed().as_secs_f64();
                for (l, ended) in self.lines.iter().zip(&self.ended) {
                    if !self.only_active || !ended {
                        eprintln!("{}", Self::line(l, self.name_width, elapsed));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_says_where_a_member_stands_and_when_it_ends() {
        let s = MemberStatus {
            name: "cnn".into(),
            step: 300,
            total_steps: 904,
            epoch: (3, 8),
            loss: 0.25,
            steps_per_s: 100.0,
            mem_bytes: 15 << 20,
            scores: Some("val acc 0.9712".into()),
            note: String::new(),
            active: true,
        };
        let l = Progress::line(&s, 6, 125.0);
        assert_eq!(
            l,
            "cnn     step 300/904  epoch 3/8  loss 0.2500  val acc 0.9712  100 steps/s  mem 15.0 MiB  2:05 elapsed, \
             ETA 0:06"
        );
        assert_eq!(clock(3723.0), "1:02:03");
        let done = MemberStatus { step: 904, ..s };
        assert!(!Progress::line(&done, 6, 130.0).contains("ETA"));
    }

    #[test]
    fn a_sweep_shows_a_trial_while_it_trains_and_its_end_once() {
        let names = ["t0".to_string(), "t1".to_string()];
        let mut p = Progress::new(&names, true).only_active();
        p.begin();
        let queued = MemberStatus {
            name: "t1".into(),
            note: "queued".into(),
            ..Default::default()
        };
        p.update(1, queued.clone());
        assert!(
            !p.shown[1] && !p.ended[1],
            "a waiting trial has no line and has not ended"
        );
        let training = MemberStatus {
            step: 10,
            active: true,
            ..queued.clone()
        };
        p.update(1, training.clone());
        assert!(!p.ended[1]);
        let pruned = MemberStatus {
            active: false,
            note: "pruned at rung 0".into(),
            ..training
        };
        p.update(1, pruned);
        assert!(p.ended[1] && !p.shown[1]);
        // A trial that fails before its first step has ended too.
        p.update(
            0,
            MemberStatus {
                note: "out of memory before its first step".into(),
                ..queued
            },
        );
        assert!(p.ended[0]);
    }
}
