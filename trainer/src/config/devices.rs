//! Where a run trains: `[run] device` (the CPU, one card, every visible card or a list of cards), a limit per card
//! in `[memory.cards]`, and a member's pin (`[[member]] device`). Parsed without touching a GPU; checked against the
//! cards the machine shows when the run starts ([`Config::cards`], [`Config::check_card_limit`]), where an unknown
//! card or a limit above a card's memory is a [`ConfigError`] naming the key.

use std::collections::BTreeMap;
use std::fmt;

use cohort_alloc::Limit;
use cohort_autograd::spec::describe;
use serde::{Serialize, Serializer};
use toml::{Table, Value};

use super::{CResult, Config, ConfigError, MEMORY_AMOUNT, Section, memory_amount};

/// The forms `[run] device` takes, for messages.
const RUN_DEVICE: &str = "\"auto\", \"cpu\", \"cuda\" (every visible GPU), \"cuda:N\" or a list such as \
                          [\"cuda:0\", \"cuda:1\"]";

/// `[run] device`: what the run may train on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    /// The first GPU where there is one, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// Every GPU `CUDA_VISIBLE_DEVICES` leaves visible (all of them where it is unset).
    AllCards,
    /// These cards (`"cuda:N"`, or a list of them), by ordinal among the visible ones.
    Cards(Vec<usize>),
}

impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Devices::Auto => f.write_str("auto"),
            Devices::Cpu => f.write_str("cpu"),
            Devices::AllCards => f.write_str("cuda"),
            Devices::Cards(c) if c.len() == 1 => write!(f, "cuda:{}", c[0]),
            Devices::Cards(c) => {
                let names: Vec<String> = c.iter().map(|n| format!("\"cuda:{n}\"")).collect();
                write!(f, "[{}]", names.join(", "))
            }
        }
    }
}

impl Serialize for Devices {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `[[member]] device`: the one place a member trains, whatever the planner would choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// The CPU, beside members on GPUs (a small side model next to a main one).
    Cpu,
    /// The card with this ordinal.
    Card(usize),
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pin::Cpu => f.write_str("cpu"),
            Pin::Card(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Serialize for Pin {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `"cuda:N"`: the ordinal.
fn card_ordinal(s: &str) -> Option<usize> {
    s.trim()
        .to_ascii_lowercase()
        .strip_prefix("cuda:")
        .and_then(|n| n.parse().ok())
}

/// `[run] device`: a string, or a list of distinct cards.
pub(super) fn parse_run_device(s: &Section<'_>) -> CResult<Devices> {
    let bad = |found: String| s.error("device", format!("expected {RUN_DEVICE}, found {found}"));
    match s.take("device") {
        None => Ok(Devices::Auto),
        Some(Value::String(v)) => match v.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Devices::Auto),
            "cpu" => Ok(Devices::Cpu),
            "cuda" => Ok(Devices::AllCards),
            _ => card_ordinal(v)
                .map(|n| Devices::Cards(vec![n]))
                .ok_or_else(|| bad(format!("\"{v}\""))),
        },
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut cards = Vec::new();
            for item in items {
                let n = match item {
                    Value::String(v) => card_ordinal(v),
                    _ => None,
                };
                let Some(n) = n else {
                    return Err(s.error(
                        "device",
                        format!(
                            "a list of cards holds \"cuda:N\" names only, found {} (for the CPU write \
                             device = \"cpu\"; to put one member there, write device = \"cpu\" in its [[member]])",
                            describe(item)
                        ),
                    ));
                };
                if cards.contains(&n) {
                    return Err(s.error(
                        "device",
                        format!("cuda:{n} is listed twice: name each card once"),
                    ));
                }
                cards.push(n);
            }
            Ok(Devices::Cards(cards))
        }
        Some(v) => Err(bad(describe(v))),
    }
}

/// `[[member]] device`: `"cpu"` or `"cuda:N"`.
pub(super) fn parse_pin(s: &Section<'_>) -> CResult<Option<Pin>> {
    let accepted = "\"cpu\" or a card \"cuda:N\"";
    s.str("device", accepted)?
        .map(|v| match v.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Pin::Cpu),
            _ => card_ordinal(v).map(Pin::Card).ok_or_else(|| {
                s.error(
                    "device",
                    format!(
                        "expected {accepted} (a member trains on one place; [run] device lists the run's \
                         cards), found \"{v}\""
                    ),
                )
            }),
        })
        .transpose()
}

/// `[memory.cards]`: `"cuda:N" = "20GiB"`, a limit of that card's own (over `[memory] limit`).
pub(super) fn parse_card_limits(
    s: &Section<'_>,
    t: Option<&Table>,
) -> CResult<BTreeMap<usize, Limit>> {
    let mut limits = BTreeMap::new();
    for (k, v) in t.into_iter().flatten() {
        let key = format!("cards.\"{k}\"");
        let n = card_ordinal(k).ok_or_else(|| {
            s.error(
                &key,
                format!("expected a card such as \"cuda:1\" = \"20GiB\", found the key \"{k}\""),
            )
        })?;
        let l = memory_amount(v).ok_or_else(|| {
            s.error(
                &key,
                format!("expected {MEMORY_AMOUNT}, found {}", describe(v)),
            )
        })?;
        if limits.insert(n, l).is_some() {
            return Err(s.error(
                &key,
                format!("cuda:{n} has two limits here: give each card one"),
            ));
        }
    }
    Ok(limits)
}

/// The GPUs of this machine as the run sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Visible {
    /// How many cards the driver shows.
    pub count: usize,
    /// `CUDA_VISIBLE_DEVICES`, where set: the driver numbers the cards it leaves from 0, so messages name it.
    pub cuda_visible_devices: Option<String>,
}

impl Visible {
    /// This machine's: the driver's count (0 without a driver) and the environment's `CUDA_VISIBLE_DEVICES`.
    pub fn now() -> Visible {
        Visible {
            count: cohort_tensor::cuda::device_count().unwrap_or(0),
            cuda_visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        }
    }

    /// What the machine shows, for a message about a card it does not have.
    fn describe(&self) -> String {
        let cards = match self.count {
            0 => "no GPU is visible (no driver, or none left visible)".to_string(),
            1 => "one GPU is visible, cuda:0".to_string(),
            n => format!("{n} GPUs are visible, cuda:0 to cuda:{}", n - 1),
        };
        match &self.cuda_visible_devices {
            Some(v) => format!(
                "{cards} (CUDA_VISIBLE_DEVICES=\"{v}\": the cards it leaves are numbered from 0 in its order)"
            ),
            None => cards,
        }
    }
}

impl Config {
    /// The cards the run trains on (empty: the CPU), from `[run] device` and what `visible` shows: `"auto"` is
    /// the first card, or the CPU where there is none.
    ///
    /// # Errors
    /// A card, in `[run] device`, a member's `device` or `[memory.cards]`, beyond the visible ones; a member
    /// pinned to a card the run does not train on; `"cuda"` where no GPU is visible.
    pub fn cards(&self, visible: &Visible) -> CResult<Vec<usize>> {
        let err = |section: &str, key: &str, message: String| ConfigError {
            file: self.file.clone(),
            section: section.to_string(),
            key: key.to_string(),
            message,
        };
        let unknown = |n: usize| {
            format!(
                "there is no card cuda:{n}: {}; name a card below {}, or write \"cpu\"",
                visible.describe(),
                visible.count
            )
        };
        let cards = match &self.run.device {
            Devices::Cpu => Vec::new(),
            Devices::Auto => (0..visible.count.min(1)).collect(),
            Devices::AllCards if visible.count == 0 => {
                return Err(err(
                    "[run]",
                    "device",
                    format!(
                        "\"cuda\" trains on every visible GPU, but {}: write \"auto\" or \"cpu\"",
                        visible.describe()
                    ),
                ));
            }
            Devices::AllCards => (0..visible.count).collect(),
            Devices::Cards(c) => {
                if let Some(&n) = c.iter().find(|&&n| n >= visible.count) {
                    return Err(err("[run]", "device", unknown(n)));
                }
                c.clone()
            }
        };
        if let Some(&n) = self.memory.cards.keys().find(|&&n| n >= visible.count) {
            return Err(err("[memory]", &format!("cards.\"cuda:{n}\""), unknown(n)));
        }
        for m in &self.members {
            let Some(Pin::Card(n)) = m.pin else { continue };
            let section = format!("[[member]] {}", m.table_index);
            if n >= visible.count {
                return Err(err(&section, "device", unknown(n)));
            }
            if !cards.contains(&n) {
                return Err(err(
                    &section,
                    "device",
                    format!(
                        "member \"{}\" is pinned to cuda:{n}, but the run trains on {}: add the card to \
                         [run] device, or pin the member to one of the run's cards or to \"cpu\"",
                        m.name,
                        match cards.as_slice() {
                            [] => "the CPU".to_string(),
                            c => c
                                .iter()
                                .map(|n| format!("cuda:{n}"))
                                .collect::<Vec<_>>()
                                .join(", "),
                        }
                    ),
                ));
            }
        }
        Ok(cards)
    }

    /// The limit of card `n`: its own in `[memory.cards]`, else `[memory] limit`.
    pub fn card_limit(&self, n: usize) -> Option<Limit> {
        self.memory.cards.get(&n).copied().or(self.memory.limit)
    }

    /// Checks card `n`'s limit against its memory, `total` bytes, and returns its budget: the limit, else the
    /// whole card.
    ///
    /// # Errors
    /// A limit above the card's memory, naming the key that set it.
    pub fn check_card_limit(&self, n: usize, total: u64) -> CResult<u64> {
        let Some(limit) = self.card_limit(n) else {
            return Ok(total);
        };
        let bytes = limit.bytes(total);
        if let Limit::Bytes(b) = limit
            && b > total
        {
            let key = if self.memory.cards.contains_key(&n) {
                format!("cards.\"cuda:{n}\"")
            } else {
                "limit".to_string()
            };
            return Err(ConfigError {
                file: self.file.clone(),
                section: "[memory]".into(),
                key,
                message: format!(
                    "cuda:{n} has {} of memory, less than the limit of {}: write at most \"{}\", or a share \
                     such as \"90%\"",
                    crate::report::bytes(total),
                    crate::report::bytes(b),
                    crate::report::bytes(total).replace(' ', ""),
                ),
            });
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMBER: &str = "[[member]]\nname = \"m\"\nmodel = { layers = [{ linear = 2 }] }\n";

    fn parse(text: &str) -> CResult<Config> {
        Config::parse(text, "d.toml")
    }

    fn visible(count: usize) -> Visible {
        Visible {
            count,
            cuda_visible_devices: None,
        }
    }

    #[test]
    fn run_device_forms() {
        let devices =
            |d: &str| parse(&format!("[run]\ndevice = {d}\n{MEMBER}")).map(|c| c.run.device);
        assert_eq!(devices("\"cuda\""), Ok(Devices::AllCards));
        assert_eq!(devices("\"cuda:1\""), Ok(Devices::Cards(vec![1])));
        assert_eq!(
            devices("[\"cuda:0\", \"cuda:2\"]"),
            Ok(Devices::Cards(vec![0, 2]))
        );
        assert_eq!(devices("\"cpu\""), Ok(Devices::Cpu));
        let e = devices("[\"cuda:0\", \"cuda:0\"]").unwrap_err();
        assert_eq!((e.section.as_str(), e.key.as_str()), ("[run]", "device"));
        assert!(e.message.contains("twice"), "{e}");
        let e = devices("[\"cuda:0\", \"cpu\"]").unwrap_err();
        assert!(
            e.message.contains("\"cpu\"") && e.message.contains("[[member]]"),
            "{e}"
        );
        let e = devices("\"tpu\"").unwrap_err();
        assert!(e.message.contains("found \"tpu\""), "{e}");
        assert!(e.message.contains("[\"cuda:0\", \"cuda:1\"]"), "{e}");
        let e = devices("3").unwrap_err();
        assert!(e.message.contains("the integer 3"), "{e}");
        // Written back as configs write it, so a run's saved config says what it trained on.
        assert_eq!(
            Devices::Cards(vec![0, 2]).to_string(),
            "[\"cuda:0\", \"cuda:2\"]"
        );
        assert_eq!(Devices::Cards(vec![3]).to_string(), "cuda:3");
    }

    #[test]
    fn cards_honour_what_is_visible() {
        let c = parse(&format!("[run]\ndevice = \"cuda\"\n{MEMBER}")).unwrap();
        assert_eq!(c.cards(&visible(4)), Ok(vec![0, 1, 2, 3]));
        let e = c.cards(&visible(0)).unwrap_err();
        assert!(e.message.contains("no GPU is visible"), "{e}");
        let auto = parse(MEMBER).unwrap();
        assert_eq!(auto.cards(&visible(3)), Ok(vec![0]));
        assert_eq!(auto.cards(&visible(0)), Ok(vec![]));
        assert_eq!(
            parse(&format!("[run]\ndevice = \"cpu\"\n{MEMBER}"))
                .unwrap()
                .cards(&visible(2)),
            Ok(vec![])
        );
    }

    #[test]
    fn an_unknown_card_is_named() {
        let c = parse(&format!(
            "[run]\ndevice = [\"cuda:0\", \"cuda:2\"]\n{MEMBER}"
        ))
        .unwrap();
        let two = Visible {
            count: 2,
            cuda_visible_devices: Some("4,5".into()),
        };
        let e = c.cards(&two).unwrap_err();
        assert_eq!((e.section.as_str(), e.key.as_str()), ("[run]", "device"));
        assert!(e.message.contains("no card cuda:2"), "{e}");
        assert!(e.message.contains("cuda:0 to cuda:1"), "{e}");
        assert!(e.message.contains("CUDA_VISIBLE_DEVICES=\"4,5\""), "{e}");
        assert_eq!(c.cards(&visible(3)), Ok(vec![0, 2]));

        let pinned = "[run]\ndevice = \"cuda\"\n[[member]]\nname = \"m\"\n\
                      model = { layers = [{ linear = 2 }] }\ndevice = \"cuda:5\"\n";
        let e = parse(pinned).unwrap().cards(&visible(2)).unwrap_err();
        assert_eq!(
            (e.section.as_str(), e.key.as_str()),
            ("[[member]] 1", "device")
        );
        assert!(e.message.contains("no card cuda:5"), "{e}");

        let e = parse(&format!("[memory.cards]\n\"cuda:3\" = \"10GiB\"\n{MEMBER}"))
            .unwrap()
            .cards(&visible(1))
            .unwrap_err();
        assert_eq!(
            (e.section.as_str(), e.key.as_str()),
            ("[memory]", "cards.\"cuda:3\"")
        );
    }

    #[test]
    fn a_member_is_pinned_to_the_cpu_or_one_of_the_runs_cards() {
        let text = |run: &str, pin: &str| {
            format!(
                "[run]\ndevice = {run}\n[[member]]\nname = \"main\"\nmodel = {{ layers = [{{ linear = 2 }}] }}\n\
                 [[member]]\nname = \"side\"\nmodel = {{ layers = [{{ linear = 2 }}] }}\ndevice = {pin}\n"
            )
        };
        let c = parse(&text("\"cuda:0\"", "\"cpu\"")).unwrap();
        assert_eq!(c.members[1].pin, Some(Pin::Cpu));
        assert_eq!(c.members[0].pin, None);
        assert_eq!(c.cards(&visible(1)), Ok(vec![0]));
        let c = parse(&text("\"cuda:0\"", "\"cuda:1\"")).unwrap();
        let e = c.cards(&visible(2)).unwrap_err();
        assert!(
            e.message.contains("\"side\" is pinned to cuda:1")
                && e.message.contains("trains on cuda:0"),
            "{e}"
        );
        let e = parse(&text("\"cuda\"", "\"cuda\"")).unwrap_err();
        assert_eq!(e.key, "device");
        assert!(e.message.contains("found \"cuda\""), "{e}");
        let c = parse(&text("\"cuda\"", "\"cuda:1\"")).unwrap();
        assert_eq!(c.members[1].pin, Some(Pin::Card(1)));
        assert_eq!(c.cards(&visible(2)), Ok(vec![0, 1]));
    }

    #[test]
    fn limits_per_card() {
        let c = parse(&format!(
            "[run]\ndevice = \"cuda\"\n[memory]\nlimit = \"40GiB\"\ncards = {{ \"cuda:1\" = \"20GiB\" }}\n{MEMBER}"
        ))
        .unwrap();
        assert_eq!(c.card_limit(0), Some(Limit::Bytes(40 << 30)));
        assert_eq!(c.card_limit(1), Some(Limit::Bytes(20 << 30)));
        assert_eq!(c.check_card_limit(1, 80 << 30), Ok(20 << 30));
        let e = c.check_card_limit(0, 24 << 30).unwrap_err();
        assert_eq!((e.section.as_str(), e.key.as_str()), ("[memory]", "limit"));
        assert!(
            e.message.contains("cuda:0 has 24.0 GiB") && e.message.contains("40.0 GiB"),
            "{e}"
        );
        let e = c.check_card_limit(1, 16 << 30).unwrap_err();
        assert_eq!(e.key, "cards.\"cuda:1\"");
        assert!(e.message.contains("at most \"16.0GiB\""), "{e}");
        let none = parse(MEMBER).unwrap();
        assert_eq!(none.check_card_limit(0, 80 << 30), Ok(80 << 30));

        for (table, found) in [
            ("\"cuda:0\" = \"lots\"", "\"lots\""),
            ("card0 = \"1GiB\"", "the key \"card0\""),
        ] {
            let e = parse(&format!("[memory.cards]\n{table}\n{MEMBER}")).unwrap_err();
            assert_eq!(e.section, "[memory]");
            assert!(e.key.starts_with("cards."), "{e}");
            assert!(e.message.contains(found), "{e}");
        }
    }
}
