//! The HParams dashboard's data, encoded as `tensorboard.plugins.hparams.summary_v2` writes it.
//!
//! TensorBoard's HParams plugin reads no file of its own: it scans every run's summaries for three tags whose
//! `SummaryMetadata.plugin_data` (plugin `"hparams"`) holds an `HParamsPluginData` message
//! (tensorboard/plugins/hparams/plugin_data.proto, api.proto):
//!
//! - `_hparams_/experiment` (`Experiment { hparam_infos, metric_infos }`) in the logdir's own event file,
//!   `runs/<run>/events.out.tfevents.*.hparams` ([`write_experiment`]). It names the columns: each hyper-parameter
//!   with its type and domain, and each metric as a `(group, tag)` pair. Group `""` means "in the session's own
//!   run", which is where a member writes its `val/accuracy`, `train/loss` and the like.
//! - `_hparams_/session_start_info` (`SessionStartInfo { hparams, group_name, start_time_secs }`) in each member's
//!   file ([`EventWriter::hparams_session_start`]): the member's run (`runs/<run>/<member>`) becomes a session, one
//!   row of the table, with the metrics' last values read from its scalars.
//! - `_hparams_/session_end_info` (`SessionEndInfo { status, end_time_secs }`) when the member ends
//!   ([`EventWriter::hparams_session_end`]).
//!
//! Each is a `Summary.Value { tag, metadata, tensor }` at step 0 whose tensor is summary_v2's `NULL_TENSOR` (an
//! empty `DT_FLOAT` of shape `[0]`): the data lives in the metadata. TensorBoard keeps the metadata of the first
//! event it reads for a (run, tag), so each of the three is written once per run: a later one is ignored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{EventWriter, bytes_field, double_field, event_head, key, now, varint};
use crate::error::{Error, Result};

/// `SummaryMetadata.PluginData.plugin_name` of the HParams plugin.
pub const PLUGIN_NAME: &str = "hparams";
/// The experiment's tag (in the logdir's own run).
pub const EXPERIMENT_TAG: &str = "_hparams_/experiment";
/// A session's start (in the member's run).
pub const SESSION_START_INFO_TAG: &str = "_hparams_/session_start_info";
/// A session's end (in the member's run).
pub const SESSION_END_INFO_TAG: &str = "_hparams_/session_end_info";

/// The ending of the experiment's file name, which [`write_experiment`] recognises as its own.
const EXPERIMENT_SUFFIX: &str = ".hparams";

/// A hyper-parameter's domain for the experiment.
#[derive(Debug, Clone, PartialEq)]
pub enum Domain {
    /// A real interval `[min, max]` (a `uniform`, `loguniform` or `int` search dimension): type float64.
    Interval {
        /// Its lower end.
        min: f64,
        /// Its upper end.
        max: f64,
    },
    /// The values it may take (a `choice` or a grid). All booleans: type bool; all numbers: float64; otherwise
    /// string, with each non-string value as its JSON text.
    Discrete(Vec<Value>),
    /// Not known ahead (or an empty list): no type and no domain, as summary_v2 writes an `HParam` without one;
    /// TensorBoard then shows the column without a filter.
    Unknown,
}

/// A hyper-parameter of the experiment: a column of the HParams table.
#[derive(Debug, Clone, PartialEq)]
pub struct HParamInfo {
    /// Its name, a key of the maps given to [`EventWriter::hparams_session_start`].
    pub name: String,
    /// Its domain, which also decides its type.
    pub domain: Domain,
}

/// How a session (a member) ended, as the HParams dashboard's status filter shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionStatus {
    /// It trained to its end (`STATUS_SUCCESS`).
    Success,
    /// An error ended it (`STATUS_FAILURE`).
    Failure,
    /// A sweep's scheduler stopped it early on purpose (pruned). api.proto's `Status` has no such value; this
    /// writes `STATUS_UNKNOWN`. Failure would file a deliberate stop with the crashes one wants to look at, and
    /// Success would let "Success only" mix trials cut short at a rung (metrics from an earlier step) with those
    /// that trained to the end; Unknown keeps them apart, so each filter means what it says.
    Aborted,
    /// Still training (`STATUS_RUNNING`). TensorBoard keeps the first end it reads, so this can never be replaced
    /// by the real ending later: a session without an end already shows as unknown, which is the better way to
    /// say "running".
    Running,
}

impl SessionStatus {
    /// api.proto's `Status` value.
    fn proto(self) -> u64 {
        match self {
            SessionStatus::Aborted => 0,
            SessionStatus::Success => 1,
            SessionStatus::Failure => 2,
            SessionStatus::Running => 3,
        }
    }
}

impl From<crate::report::Status> for SessionStatus {
    fn from(s: crate::report::Status) -> SessionStatus {
        match s {
            crate::report::Status::Completed => SessionStatus::Success,
            crate::report::Status::Pruned => SessionStatus::Aborted,
            crate::report::Status::Failed => SessionStatus::Failure,
        }
    }
}

/// api.proto's `DataType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataType {
    Unset = 0,
    String = 1,
    Bool = 2,
    Float64 = 3,
}

impl Domain {
    fn data_type(&self) -> DataType {
        match self {
            Domain::Interval { .. } => DataType::Float64,
            Domain::Unknown => DataType::Unset,
            Domain::Discrete(v) if v.is_empty() => DataType::Unset,
            Domain::Discrete(v) if v.iter().all(Value::is_boolean) => DataType::Bool,
            Domain::Discrete(v) if v.iter().all(Value::is_number) => DataType::Float64,
            Domain::Discrete(_) => DataType::String,
        }
    }
}

/// A `google.protobuf.Value`: numbers as `number_value` (2), strings as `string_value` (3), booleans as
/// `bool_value` (4); anything else (a table, a list, null) as its JSON text, which is what a person would type.
/// A oneof member is written even when it holds its default (`0.0`, `false`, `""`), as proto3 does: without it
/// the value would read back as unset.
fn protobuf_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Bool(b) => {
            key(out, 4, 0);
            varint(out, u64::from(*b));
        }
        Value::Number(n) => match n.as_f64() {
            Some(f) => double_field(out, 2, f),
            None => bytes_field(out, 3, n.to_string().as_bytes()),
        },
        Value::String(s) => bytes_field(out, 3, s.as_bytes()),
        other => bytes_field(out, 3, other.to_string().as_bytes()),
    }
}

fn hparam_info(out: &mut Vec<u8>, info: &HParamInfo) {
    bytes_field(out, 1, info.name.as_bytes()); // HParamInfo.name
    let ty = info.domain.data_type();
    if ty != DataType::Unset {
        key(out, 4, 0); // HParamInfo.type
        varint(out, ty as u64);
    }
    match &info.domain {
        Domain::Interval { min, max } => {
            let mut interval = Vec::new();
            double_field(&mut interval, 1, *min); // Interval.min_value
            double_field(&mut interval, 2, *max); // Interval.max_value
            bytes_field(out, 6, &interval); // HParamInfo.domain_interval
        }
        Domain::Discrete(values) if ty != DataType::Unset => {
            // A string column lists strings, so its filter matches the sessions' string values.
            let mut values: Vec<Value> = values
                .iter()
                .map(|v| match (ty, v) {
                    (DataType::String, Value::String(_))
                    | (DataType::Bool | DataType::Float64, _) => v.clone(),
                    (_, other) => Value::String(other.to_string()),
                })
                .collect();
            // Sorted, as summary_v2's `Discrete` sorts them (false before true; strings by code point).
            values.sort_by(|a, b| match ty {
                DataType::Bool => a.as_bool().cmp(&b.as_bool()),
                DataType::Float64 => {
                    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
                    f(a).total_cmp(&f(b))
                }
                _ => a.as_str().cmp(&b.as_str()),
            });
            let mut list = Vec::new();
            for v in &values {
                let mut value = Vec::new();
                protobuf_value(&mut value, v);
                bytes_field(&mut list, 1, &value); // ListValue.values
            }
            bytes_field(out, 5, &list); // HParamInfo.domain_discrete
        }
        Domain::Discrete(_) | Domain::Unknown => {}
    }
}

/// api.proto's `DatasetType` from the tag's prefix: `train/` training, `val/` validation, anything else (test)
/// unknown, as the enum has no test value.
fn dataset_type(tag: &str) -> u64 {
    if tag.starts_with("train/") {
        1
    } else if tag.starts_with("val/") || tag.starts_with("validation/") {
        2
    } else {
        0
    }
}

/// The encoded `Event { wall_time, summary { value { tag, tensor: NULL_TENSOR, metadata { plugin_data {
/// plugin_name: "hparams", content } } } } }`, `content` being an encoded `HParamsPluginData`.
fn plugin_event(wall_time: f64, tag: &str, content: &[u8]) -> Vec<u8> {
    let mut plugin_data = Vec::new();
    bytes_field(&mut plugin_data, 1, PLUGIN_NAME.as_bytes()); // PluginData.plugin_name
    bytes_field(&mut plugin_data, 2, content); // PluginData.content
    let mut metadata = Vec::new();
    bytes_field(&mut metadata, 1, &plugin_data); // SummaryMetadata.plugin_data
    // metadata.NULL_TENSOR: TensorProto { dtype: DT_FLOAT (1), tensor_shape { dim { size: 0 } } }.
    let mut shape = Vec::new();
    bytes_field(&mut shape, 2, &[]); // TensorShapeProto.dim, its size 0 left out
    let mut tensor = Vec::new();
    key(&mut tensor, 1, 0); // TensorProto.dtype
    varint(&mut tensor, 1);
    bytes_field(&mut tensor, 2, &shape); // TensorProto.tensor_shape
    let mut value = Vec::new();
    bytes_field(&mut value, 1, tag.as_bytes()); // Summary.Value.tag
    bytes_field(&mut value, 8, &tensor); // Summary.Value.tensor
    bytes_field(&mut value, 9, &metadata); // Summary.Value.metadata
    let mut summary = Vec::new();
    bytes_field(&mut summary, 1, &value); // Summary.value
    let mut e = event_head(wall_time, 0);
    bytes_field(&mut e, 5, &summary); // Event.summary
    e
}

/// The encoded experiment event: every hyper-parameter and every metric (a scalar tag of the members' runs).
/// `HParamsPluginData.version` is 0, which proto3 leaves out.
pub fn experiment_event(wall_time: f64, hparams: &[HParamInfo], metric_tags: &[&str]) -> Vec<u8> {
    let mut experiment = Vec::new();
    double_field(&mut experiment, 3, wall_time); // Experiment.time_created_secs
    for info in hparams {
        let mut m = Vec::new();
        hparam_info(&mut m, info);
        bytes_field(&mut experiment, 4, &m); // Experiment.hparam_infos
    }
    for tag in metric_tags {
        let mut name = Vec::new();
        bytes_field(&mut name, 2, tag.as_bytes()); // MetricName.tag; group "" is the session's own run
        let mut m = Vec::new();
        bytes_field(&mut m, 1, &name); // MetricInfo.name
        let ty = dataset_type(tag);
        if ty != 0 {
            key(&mut m, 5, 0); // MetricInfo.dataset_type
            varint(&mut m, ty);
        }
        bytes_field(&mut experiment, 5, &m); // Experiment.metric_infos
    }
    let mut content = Vec::new();
    bytes_field(&mut content, 2, &experiment); // HParamsPluginData.experiment
    plugin_event(wall_time, EXPERIMENT_TAG, &content)
}

/// The encoded session start of one member: its hyper-parameters (in key order, as summary_v2 writes them) and
/// its group. Sessions of one group are one row whose metrics TensorBoard aggregates (repeats of one
/// configuration under other seeds); an empty group makes the session a group of its own.
pub fn session_start_info_event(
    wall_time: f64,
    hparams: &BTreeMap<String, Value>,
    group: &str,
) -> Vec<u8> {
    let mut start = Vec::new();
    for (name, v) in hparams {
        let mut value = Vec::new();
        protobuf_value(&mut value, v);
        let mut entry = Vec::new();
        bytes_field(&mut entry, 1, name.as_bytes()); // HparamsEntry.key
        bytes_field(&mut entry, 2, &value); // HparamsEntry.value
        bytes_field(&mut start, 1, &entry); // SessionStartInfo.hparams
    }
    if !group.is_empty() {
        bytes_field(&mut start, 4, group.as_bytes()); // SessionStartInfo.group_name
    }
    double_field(&mut start, 5, wall_time); // SessionStartInfo.start_time_secs
    let mut content = Vec::new();
    bytes_field(&mut content, 3, &start); // HParamsPluginData.session_start_info
    plugin_event(wall_time, SESSION_START_INFO_TAG, &content)
}

/// The encoded session end of one member.
pub fn session_end_info_event(wall_time: f64, status: SessionStatus) -> Vec<u8> {
    let mut end = Vec::new();
    if status.proto() != 0 {
        key(&mut end, 1, 0); // SessionEndInfo.status
        varint(&mut end, status.proto());
    }
    double_field(&mut end, 2, wall_time); // SessionEndInfo.end_time_secs
    let mut content = Vec::new();
    bytes_field(&mut content, 4, &end); // HParamsPluginData.session_end_info
    plugin_event(wall_time, SESSION_END_INFO_TAG, &content)
}

/// Writes the experiment to a new `events.out.tfevents.<time>.<host>.hparams` file in `root` (the run directory,
/// TensorBoard's logdir, whose own files are its run `.`), synced, and then removes the experiment files written
/// there before: TensorBoard would keep the first experiment it reads, so a resumed run that grew its metrics
/// must leave only its newest one.
///
/// # Errors
/// I/O errors naming the file or the directory.
pub fn write_experiment(
    root: &Path,
    hparams: &[HParamInfo],
    metric_tags: &[&str],
) -> Result<PathBuf> {
    let (mut w, t) = EventWriter::create_named(root, EXPERIMENT_SUFFIX)?;
    w.write_event(&experiment_event(t, hparams, metric_tags))?;
    w.sync()?;
    let path = w.path.clone();
    drop(w);
    for entry in std::fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let entry = entry.map_err(|e| Error::io(root, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let old = entry.path();
        if old != path
            && name.starts_with("events.out.tfevents.")
            && name.ends_with(EXPERIMENT_SUFFIX)
        {
            std::fs::remove_file(&old).map_err(|e| Error::io(&old, e))?;
        }
    }
    Ok(path)
}

impl EventWriter {
    /// Makes this member's run a session of the experiment, with its hyper-parameters (keys as in the
    /// experiment's [`HParamInfo::name`]) and its group (see [`session_start_info_event`]). Once per member:
    /// a resumed member's repeat is harmless, TensorBoard keeps the first.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn hparams_session_start(
        &mut self,
        hparams: &BTreeMap<String, Value>,
        group: &str,
    ) -> Result<()> {
        self.write_event(&session_start_info_event(now(), hparams, group))
    }

    /// Ends this member's session: once, when the member has ended (TensorBoard keeps the first end it reads).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn hparams_session_end(&mut self, status: SessionStatus) -> Result<()> {
        self.write_event(&session_end_info_event(now(), status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// One field as the wire holds it.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Wire<'a> {
        Varint(u64),
        Fixed64(u64),
        Bytes(&'a [u8]),
        Fixed32(u32),
    }

    fn read_varint(b: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (byte, rest) = b.split_first().expect("a varint runs past the end");
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return v;
            }
        }
        panic!("a varint longer than 10 bytes");
    }

    /// Every `(field number, value)` of one message, in wire order: a walk written apart from the encoder, so
    /// that a wrong field number or wire type there shows here.
    fn fields(mut b: &[u8]) -> Vec<(u32, Wire<'_>)> {
        let mut out = Vec::new();
        while !b.is_empty() {
            let k = read_varint(&mut b);
            let field = u32::try_from(k >> 3).unwrap();
            let w = match k & 7 {
                0 => Wire::Varint(read_varint(&mut b)),
                1 => {
                    let (v, rest) = b.split_at(8);
                    b = rest;
                    Wire::Fixed64(u64::from_le_bytes(v.try_into().unwrap()))
                }
                2 => {
                    let len = read_varint(&mut b) as usize;
                    let (v, rest) = b.split_at(len);
                    b = rest;
                    Wire::Bytes(v)
                }
                5 => {
                    let (v, rest) = b.split_at(4);
                    b = rest;
                    Wire::Fixed32(u32::from_le_bytes(v.try_into().unwrap()))
                }
                w => panic!("wire type {w} of field {field}"),
            };
            out.push((field, w));
        }
        out
    }

    fn all(b: &[u8], field: u32) -> Vec<Wire<'_>> {
        fields(b)
            .into_iter()
            .filter(|(f, _)| *f == field)
            .map(|(_, w)| w)
            .collect()
    }

    fn one(b: &[u8], field: u32) -> Wire<'_> {
        let found = all(b, field);
        assert_eq!(found.len(), 1, "field {field} in {:?}", fields(b));
        found[0]
    }

    fn message(b: &[u8], field: u32) -> &[u8] {
        match one(b, field) {
            Wire::Bytes(m) => m,
            w => panic!("field {field} is {w:?}, not length-delimited"),
        }
    }

    fn string(b: &[u8], field: u32) -> &str {
        std::str::from_utf8(message(b, field)).unwrap()
    }

    fn double(b: &[u8], field: u32) -> u64 {
        match one(b, field) {
            Wire::Fixed64(v) => v,
            w => panic!("field {field} is {w:?}, not a double"),
        }
    }

    fn enum_value(b: &[u8], field: u32) -> u64 {
        match one(b, field) {
            Wire::Varint(v) => v,
            w => panic!("field {field} is {w:?}, not a varint"),
        }
    }

    fn absent(b: &[u8], field: u32) {
        assert!(all(b, field).is_empty(), "field {field} in {:?}", fields(b));
    }

    /// Checks the event's envelope (step 0, one summary value with `tag`, summary_v2's null tensor, plugin
    /// "hparams", version 0) and returns the `HParamsPluginData` field `data` (experiment 2, start 3, end 4).
    fn plugin_data(event: &[u8], wall_time: f64, tag: &str, data: u32) -> Vec<u8> {
        assert_eq!(double(event, 1), wall_time.to_bits()); // Event.wall_time
        absent(event, 2); // Event.step 0
        let summary = message(event, 5);
        let value = message(summary, 1);
        assert_eq!(string(value, 1), tag);
        absent(value, 2); // no simple_value: the scalars dashboard must not list it
        assert_eq!(message(value, 8), [0x08, 0x01, 0x12, 0x02, 0x12, 0x00]); // NULL_TENSOR
        let plugin = message(message(value, 9), 1);
        assert_eq!(string(plugin, 1), "hparams");
        let content = message(plugin, 2);
        absent(content, 1); // HParamsPluginData.version 0
        assert_eq!(fields(content).len(), 1, "{:?}", fields(content));
        message(content, data).to_vec()
    }

    #[test]
    fn a_session_start_decodes_field_by_field() {
        let hparams: BTreeMap<String, Value> = [
            ("lr", json!(0.001)),
            ("width", json!(64)),
            ("dropout", json!(0.0)),
            ("act", json!("relu")),
            ("nesterov", json!(false)),
            ("layers", json!([64, 32])),
            ("opt", json!({"name": "adam"})),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let event = session_start_info_event(1.5e9, &hparams, "trial-3");
        let start = plugin_data(&event, 1.5e9, "_hparams_/session_start_info", 3);
        assert_eq!(string(&start, 4), "trial-3"); // group_name
        assert_eq!(double(&start, 5), 1.5e9f64.to_bits()); // start_time_secs
        let entries: Vec<(&str, Vec<(u32, Wire<'_>)>)> = all(&start, 1)
            .into_iter()
            .map(|w| match w {
                Wire::Bytes(e) => (string(e, 1), fields(message(e, 2))),
                w => panic!("map entry {w:?}"),
            })
            .collect();
        let expected: Vec<(&str, Vec<(u32, Wire<'_>)>)> = vec![
            ("act", vec![(3, Wire::Bytes(b"relu"))]),
            ("dropout", vec![(2, Wire::Fixed64(0.0f64.to_bits()))]),
            ("layers", vec![(3, Wire::Bytes(b"[64,32]"))]),
            ("lr", vec![(2, Wire::Fixed64(0.001f64.to_bits()))]),
            ("nesterov", vec![(4, Wire::Varint(0))]),
            ("opt", vec![(3, Wire::Bytes(br#"{"name":"adam"}"#))]),
            ("width", vec![(2, Wire::Fixed64(64.0f64.to_bits()))]),
        ];
        assert_eq!(entries, expected);

        // No group: the field is left out, and TensorBoard makes the session a group of its own.
        let event = session_start_info_event(2.0, &BTreeMap::new(), "");
        let start = plugin_data(&event, 2.0, "_hparams_/session_start_info", 3);
        assert_eq!(fields(&start), vec![(5, Wire::Fixed64(2.0f64.to_bits()))]);
    }

    #[test]
    fn the_experiment_types_each_hparam_by_its_domain_and_lists_the_metrics() {
        let hparams = [
            HParamInfo {
                name: "lr".into(),
                domain: Domain::Interval {
                    min: 1e-4,
                    max: 0.1,
                },
            },
            HParamInfo {
                name: "width".into(),
                domain: Domain::Discrete(vec![json!(64), json!(32)]),
            },
            HParamInfo {
                name: "nesterov".into(),
                domain: Domain::Discrete(vec![json!(true), json!(false)]),
            },
            HParamInfo {
                name: "act".into(),
                domain: Domain::Discrete(vec![json!("relu"), json!("gelu")]),
            },
            HParamInfo {
                name: "batch".into(),
                domain: Domain::Discrete(vec![json!(32), json!("auto")]),
            },
            HParamInfo {
                name: "seed".into(),
                domain: Domain::Unknown,
            },
            HParamInfo {
                name: "empty".into(),
                domain: Domain::Discrete(vec![]),
            },
        ];
        let event = experiment_event(
            7.0,
            &hparams,
            &["train/loss", "val/accuracy", "test/accuracy"],
        );
        let experiment = plugin_data(&event, 7.0, "_hparams_/experiment", 2);
        assert_eq!(double(&experiment, 3), 7.0f64.to_bits()); // time_created_secs
        let infos: Vec<&[u8]> = all(&experiment, 4)
            .into_iter()
            .map(|w| match w {
                Wire::Bytes(m) => m,
                w => panic!("{w:?}"),
            })
            .collect();
        assert_eq!(infos.len(), hparams.len());
        let names: Vec<&str> = infos.iter().map(|m| string(m, 1)).collect();
        assert_eq!(
            names,
            ["lr", "width", "nesterov", "act", "batch", "seed", "empty"]
        );
        let types: Vec<Option<u64>> = infos
            .iter()
            .map(|m| (!all(m, 4).is_empty()).then(|| enum_value(m, 4)))
            .collect();
        // DATA_TYPE_FLOAT64 3, BOOL 2, STRING 1; unset left out.
        assert_eq!(
            types,
            [Some(3), Some(3), Some(2), Some(1), Some(1), None, None]
        );

        let interval = message(infos[0], 6);
        assert_eq!(double(interval, 1), 1e-4f64.to_bits());
        assert_eq!(double(interval, 2), 0.1f64.to_bits());
        absent(infos[0], 5);
        fn discrete(m: &[u8]) -> Vec<Vec<(u32, Wire<'_>)>> {
            all(message(m, 5), 1)
                .into_iter()
                .map(|w| match w {
                    Wire::Bytes(v) => fields(v),
                    w => panic!("{w:?}"),
                })
                .collect()
        }
        assert_eq!(
            discrete(infos[1]),
            [
                vec![(2, Wire::Fixed64(32.0f64.to_bits()))],
                vec![(2, Wire::Fixed64(64.0f64.to_bits()))]
            ]
        );
        assert_eq!(
            discrete(infos[2]),
            [vec![(4, Wire::Varint(0))], vec![(4, Wire::Varint(1))]]
        );
        assert_eq!(
            discrete(infos[3]),
            [
                vec![(3, Wire::Bytes(b"gelu"))],
                vec![(3, Wire::Bytes(b"relu"))]
            ]
        );
        // Sorted as summary_v2 sorts them. A mixed list is a string column: the number is listed as its text.
        assert_eq!(
            discrete(infos[4]),
            [
                vec![(3, Wire::Bytes(b"32"))],
                vec![(3, Wire::Bytes(b"auto"))]
            ]
        );
        for m in &infos[5..] {
            absent(m, 5);
            absent(m, 6);
        }

        let metrics: Vec<(&str, Option<u64>, usize)> = all(&experiment, 5)
            .into_iter()
            .map(|w| match w {
                Wire::Bytes(m) => {
                    let name = message(m, 1);
                    absent(name, 1); // group "": the session's own run
                    (
                        string(name, 2),
                        (!all(m, 5).is_empty()).then(|| enum_value(m, 5)),
                        fields(m).len(),
                    )
                }
                w => panic!("{w:?}"),
            })
            .collect();
        // DATASET_TRAINING 1, DATASET_VALIDATION 2, the test split has none.
        assert_eq!(
            metrics,
            [
                ("train/loss", Some(1), 2),
                ("val/accuracy", Some(2), 2),
                ("test/accuracy", None, 1)
            ]
        );
    }

    #[test]
    fn a_session_end_carries_api_proto_status_values() {
        let cases = [
            (SessionStatus::Success, Some(1)),
            (SessionStatus::Failure, Some(2)),
            (SessionStatus::Running, Some(3)),
            (SessionStatus::Aborted, None), // STATUS_UNKNOWN 0, left out
        ];
        for (status, expected) in cases {
            let event = session_end_info_event(9.0, status);
            let end = plugin_data(&event, 9.0, "_hparams_/session_end_info", 4);
            let got = (!all(&end, 1).is_empty()).then(|| enum_value(&end, 1));
            assert_eq!(got, expected, "{status:?}");
            assert_eq!(double(&end, 2), 9.0f64.to_bits()); // end_time_secs
        }
        use crate::report::Status;
        assert_eq!(
            SessionStatus::from(Status::Completed),
            SessionStatus::Success
        );
        assert_eq!(SessionStatus::from(Status::Pruned), SessionStatus::Aborted);
        assert_eq!(SessionStatus::from(Status::Failed), SessionStatus::Failure);
    }

    /// The events of a TFRecord file, each record's CRCs checked.
    fn events(path: &Path) -> Vec<Vec<u8>> {
        let bytes = std::fs::read(path).unwrap();
        let mut at = 0;
        let mut out = Vec::new();
        while at < bytes.len() {
            let len_bytes = &bytes[at..at + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            assert_eq!(
                bytes[at + 8..at + 12],
                super::super::masked_crc32c(len_bytes).to_le_bytes()
            );
            let data = &bytes[at + 12..at + 12 + len];
            assert_eq!(
                bytes[at + 12 + len..at + 16 + len],
                super::super::masked_crc32c(data).to_le_bytes()
            );
            out.push(data.to_vec());
            at += 16 + len;
        }
        out
    }

    fn experiment_files(dir: &Path) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".hparams"))
            .collect();
        found.sort();
        found
    }

    #[test]
    fn the_run_keeps_one_experiment_file_and_a_member_file_holds_its_session() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // A member's own event file in the root is no experiment and must survive.
        let other = root.join("events.out.tfevents.1.host");
        std::fs::write(&other, b"").unwrap();
        let hparams = [HParamInfo {
            name: "lr".into(),
            domain: Domain::Interval {
                min: 0.01,
                max: 0.1,
            },
        }];
        let first = write_experiment(root, &hparams, &["val/accuracy"]).unwrap();
        let name = first.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("events.out.tfevents.") && name.ends_with(".hparams"),
            "{name}"
        );
        let e = events(&first);
        assert_eq!(e.len(), 2);
        assert!(e[0].ends_with(b"brain.Event:2"));
        let wall = f64::from_bits(double(&e[1], 1));
        plugin_data(&e[1], wall, EXPERIMENT_TAG, 2);
        // A second experiment (a resumed run) replaces the first, even within the same second.
        let second = write_experiment(root, &hparams, &["val/accuracy", "val/loss"]).unwrap();
        assert_ne!(first, second);
        assert_eq!(experiment_files(root), std::slice::from_ref(&second));
        assert!(other.exists());
        let e = events(&second);
        let wall = f64::from_bits(double(&e[1], 1));
        assert_eq!(
            all(&plugin_data(&e[1], wall, EXPERIMENT_TAG, 2), 5).len(),
            2
        );

        let member = root.join("m0");
        std::fs::create_dir(&member).unwrap();
        let mut w = EventWriter::create(&member, None).unwrap();
        let values: BTreeMap<String, Value> = [("lr".to_string(), json!(0.05))].into();
        w.hparams_session_start(&values, "").unwrap();
        w.scalars(10, &[("val/accuracy", 0.5)]).unwrap();
        w.hparams_session_end(SessionStatus::Success).unwrap();
        let e = events(w.path());
        assert_eq!(e.len(), 4);
        let wall = f64::from_bits(double(&e[1], 1));
        let start = plugin_data(&e[1], wall, SESSION_START_INFO_TAG, 3);
        let entry = message(&start, 1);
        assert_eq!(string(entry, 1), "lr");
        assert_eq!(double(message(entry, 2), 2), 0.05f64.to_bits());
        let wall = f64::from_bits(double(&e[3], 1));
        let end = plugin_data(&e[3], wall, SESSION_END_INFO_TAG, 4);
        assert_eq!(enum_value(&end, 1), 1);
    }
}
