//! Hyper-parameter grids: a list of scalar values anywhere in a `[[member]]` table is an axis, and the member
//! expands into one member per combination, named by the values (`mlp` with `lr = [1e-3, 3e-3]` becomes
//! `mlp-lr1e-3` and `mlp-lr3e-3`). The places in a table and their short labels are shared with sampled search
//! spaces (`search`).

use toml::{Table, Value};

/// One step of a place in a table: a key, or an index into an array of tables.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum PathSeg {
    Key(String),
    Index(usize),
}

/// Where a value is in a `[[member]]` table, from its top.
pub(super) type Place = Vec<PathSeg>;

/// One grid axis: where the list is and its values.
struct Axis {
    place: Place,
    values: Vec<Value>,
}

/// Calls `visit` on every value in `t` (depth first, in key order) with its place; `visit` says whether to look
/// inside the value too (tables, and arrays of tables).
pub(super) fn walk(t: &Table, place: &mut Place, visit: &mut dyn FnMut(&Place, &Value) -> bool) {
    for (k, v) in t {
        place.push(PathSeg::Key(k.clone()));
        if visit(place, v) {
            match v {
                Value::Table(sub) => walk(sub, place, visit),
                Value::Array(a) => {
                    for (i, x) in a.iter().enumerate() {
                        if let Value::Table(sub) = x {
                            place.push(PathSeg::Index(i));
                            walk(sub, place, visit);
                            place.pop();
                        }
                    }
                }
                _ => {}
            }
        }
        place.pop();
    }
}

fn find_axes(t: &Table) -> Vec<Axis> {
    let mut out = Vec::new();
    walk(t, &mut Vec::new(), &mut |place, v| match v {
        Value::Array(a)
            if !a.is_empty()
                && a.iter()
                    .all(|x| !matches!(x, Value::Table(_) | Value::Array(_))) =>
        {
            out.push(Axis {
                place: place.clone(),
                values: a.clone(),
            });
            false
        }
        _ => true,
    });
    out
}

/// Replaces the value at `place` (which exists) with `value`.
pub(super) fn set_path(t: &mut Table, place: &[PathSeg], value: Value) {
    let mut cur: &mut Value = match &place[0] {
        PathSeg::Key(k) => t.get_mut(k).expect("a place found in this table"),
        PathSeg::Index(_) => unreachable!("a place starts with a key"),
    };
    for seg in &place[1..] {
        cur = match (seg, cur) {
            (PathSeg::Key(k), Value::Table(t)) => {
                t.get_mut(k).expect("a place found in this table")
            }
            (PathSeg::Index(i), Value::Array(a)) => &mut a[*i],
            _ => unreachable!("a place found in this table"),
        };
    }
    *cur = value;
}

/// The dotted key of a place, as errors name it (`model.layers.0.linear`).
pub(super) fn dotted(place: &[PathSeg]) -> String {
    place
        .iter()
        .map(|s| match s {
            PathSeg::Key(k) => k.clone(),
            PathSeg::Index(i) => i.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Short labels for places: the last key (`lr`), or where two places share it the whole place without the
/// `optimizer` and `model` levels (`layers0linear`, `layers2linear`).
pub(super) fn labels(places: &[&Place]) -> Vec<String> {
    let short = |p: &Place| match p.last() {
        Some(PathSeg::Key(k)) => k.clone(),
        _ => String::new(),
    };
    let full = |p: &Place| {
        p.iter()
            .filter_map(|s| match s {
                PathSeg::Key(k) if k != "optimizer" && k != "model" => Some(k.clone()),
                PathSeg::Index(i) => Some(i.to_string()),
                PathSeg::Key(_) => None,
            })
            .collect::<Vec<_>>()
            .join("")
    };
    places
        .iter()
        .map(|p| {
            let s = short(p);
            if places.iter().filter(|q| short(q) == s).count() > 1 {
                full(p)
            } else {
                s
            }
        })
        .collect()
}

/// Formats a grid value for a member name: `1e-3`, `0.5`, `128`, `relu`.
pub fn grid_value_name(v: &Value) -> String {
    match v {
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => {
            if f.fract() == 0.0 && f.abs() < 1e6 {
                format!("{}", *f as i64)
            } else if f.abs() >= 0.01 && f.abs() < 1e6 {
                format!("{f}")
            } else {
                format!("{f:e}")
            }
        }
        Value::String(s) => format!("_{s}"),
        Value::Boolean(b) => format!("_{b}"),
        other => other.to_string(),
    }
}

/// One member of a grid: its `(label, value name)` pairs, its values by label, and its table.
pub(super) struct GridPoint {
    pub(super) naming: Vec<(String, String)>,
    pub(super) values: Vec<(String, Value)>,
    pub(super) table: Table,
}

/// Expands a `[[member]]` table into one table per grid combination.
pub(super) fn expand_grid(t: &Table) -> Vec<GridPoint> {
    let axes = find_axes(t);
    if axes.is_empty() {
        return vec![GridPoint {
            naming: Vec::new(),
            values: Vec::new(),
            table: t.clone(),
        }];
    }
    let labels = labels(&axes.iter().map(|a| &a.place).collect::<Vec<_>>());
    let mut out = Vec::new();
    let mut idx = vec![0usize; axes.len()];
    loop {
        let mut table = t.clone();
        let mut naming = Vec::new();
        let mut values = Vec::new();
        for (a, (axis, &i)) in axes.iter().zip(&idx).enumerate() {
            set_path(&mut table, &axis.place, axis.values[i].clone());
            naming.push((labels[a].clone(), grid_value_name(&axis.values[i])));
            values.push((labels[a].clone(), axis.values[i].clone()));
        }
        out.push(GridPoint {
            naming,
            values,
            table,
        });
        // Odometer: the last axis varies fastest.
        let mut d = axes.len();
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < axes[d].values.len() {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_names() {
        assert_eq!(grid_value_name(&Value::Float(1e-3)), "1e-3");
        assert_eq!(grid_value_name(&Value::Float(3e-4)), "3e-4");
        assert_eq!(grid_value_name(&Value::Float(0.5)), "0.5");
        assert_eq!(grid_value_name(&Value::Float(2.0)), "2");
        assert_eq!(grid_value_name(&Value::Integer(128)), "128");
    }

    #[test]
    fn a_grid_expands_last_axis_fastest_with_labels_made_unique() {
        let t: Table =
            "name = \"m\"\nmodel = { layers = [{ linear = [8, 16] }, { linear = [2, 3] }] }\n\
                        optimizer = { adam = { lr = [1e-3] } }"
                .parse()
                .unwrap();
        let points = expand_grid(&t);
        let names: Vec<String> = points
            .iter()
            .map(|p| {
                p.naming
                    .iter()
                    .map(|(k, v)| format!("{k}{v}"))
                    .collect::<Vec<_>>()
                    .join("-")
            })
            .collect();
        assert_eq!(
            names,
            [
                "layers0linear8-layers1linear2-lr1e-3",
                "layers0linear8-layers1linear3-lr1e-3",
                "layers0linear16-layers1linear2-lr1e-3",
                "layers0linear16-layers1linear3-lr1e-3",
            ]
        );
        assert_eq!(
            points[3].values[1],
            ("layers1linear".into(), Value::Integer(3))
        );
    }
}
