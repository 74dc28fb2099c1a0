#!/usr/bin/env python3
"""Checks a run's HParams data the way TensorBoard's HParams dashboard reads it.

    python3 bench/tb_hparams_check.py runs/<run>

Loads RUN_DIR as TensorBoard's logdir with TensorBoard's own code (the event multiplexer, its data provider and
the hparams plugin's backend: the handlers behind /data/plugin/hparams/experiment and /session_groups), then
asserts:

- the run directory's own files (run ".") hold the `_hparams_/experiment` summary, and the experiment lists every
  hyper-parameter the members use and at least one metric, each metric logged by at least one session;
- every member directory with a `_hparams_/session_start_info` is a session of the table, and its hyper-parameters
  are exactly `summary.json`'s `members[i].hyperparameters` (what the session's file holds, and what the table's
  row shows, which TensorBoard takes from the group's first session);
- every session is a member of `summary.json`.

Prints one line per member (status, hyper-parameters, metric values) and exits 1 on any mismatch, 2 when RUN_DIR
is not a run. Needs only `tensorboard` and `protobuf` (no TensorFlow).
"""

import argparse
import json
import math
import os
import sys


def load(run_dir):
    # Imported here so that --help works without TensorBoard.
    from tensorboard import context as tb_context
    from tensorboard.backend.event_processing import data_provider
    from tensorboard.backend.event_processing import plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2
    from tensorboard.plugins.hparams import backend_context
    from tensorboard.plugins.hparams import get_experiment
    from tensorboard.plugins.hparams import list_session_groups
    from tensorboard.plugins.hparams import metadata

    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(run_dir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, run_dir)
    context = backend_context.Context(
        base_plugin.TBContext(logdir=run_dir, multiplexer=mux, data_provider=provider)
    )
    ctx = tb_context.RequestContext()
    experiment_id = ""
    experiment = get_experiment.Handler(
        ctx, context, experiment_id, api_pb2.GetExperimentRequest()
    ).run()
    # What the dashboard asks for: every status, every group.
    request = api_pb2.ListSessionGroupsRequest(
        allowed_statuses=[
            api_pb2.STATUS_UNKNOWN,
            api_pb2.STATUS_SUCCESS,
            api_pb2.STATUS_FAILURE,
            api_pb2.STATUS_RUNNING,
        ],
        start_index=0,
        slice_size=1 << 30,
    )
    groups = list_session_groups.Handler(ctx, context, experiment_id, request).run()
    run_tags = context.hparams_metadata(ctx, experiment_id)
    starts = {
        run: metadata.parse_session_start_info_plugin_data(tags[metadata.SESSION_START_INFO_TAG])
        for run, tags in run_tags.items()
        if metadata.SESSION_START_INFO_TAG in tags
    }
    experiment_runs = sorted(run for run, tags in run_tags.items() if metadata.EXPERIMENT_TAG in tags)
    scalar_runs = context.scalars_metadata(ctx, experiment_id)
    return api_pb2, experiment, groups, starts, experiment_runs, scalar_runs


def proto_value(v):
    """A google.protobuf.Value as Python (None for an unset one)."""
    kind = v.WhichOneof("kind")
    return {
        "number_value": lambda: v.number_value,
        "string_value": lambda: v.string_value,
        "bool_value": lambda: v.bool_value,
    }.get(kind, lambda: None)()


def same(expected, got):
    """Whether summary.json's `expected` is what cohort wrote as `got`: numbers as doubles, tables and lists as
    their JSON text."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return isinstance(expected, bool) and isinstance(got, bool) and expected == got
    if isinstance(expected, (int, float)):
        return isinstance(got, float) and (got == float(expected) or (math.isnan(got) and math.isnan(expected)))
    if isinstance(expected, str):
        return got == expected
    if not isinstance(got, str):
        return False
    try:
        return json.loads(got) == expected
    except ValueError:
        return False


def show(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return json.dumps(v) if not isinstance(v, str) else v


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="runs/<run>: the logdir, with summary.json and one directory a member")
    args = parser.parse_args()
    run_dir = os.path.abspath(args.run_dir)
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{run_dir}: no readable summary.json ({e})", file=sys.stderr)
        return 2
    members = {m["name"]: m.get("hyperparameters") or {} for m in summary.get("members", [])}

    api_pb2, experiment, groups, starts, experiment_runs, scalar_runs = load(run_dir)
    problems = []

    # The experiment: written by cohort in the logdir's own run, not inferred by TensorBoard from the sessions.
    if experiment_runs != ["."]:
        problems.append(f"the experiment summary is in runs {experiment_runs}, expected only the run directory's own '.'")
    hparam_infos = {h.name: h for h in experiment.hparam_infos}
    metrics = [(m.name.group, m.name.tag) for m in experiment.metric_infos]
    used = sorted({k for hp in members.values() for k in hp})
    missing = [k for k in used if k not in hparam_infos]
    if missing:
        problems.append(f"the experiment lacks hyper-parameters {missing} (it lists {sorted(hparam_infos)})")
    if not metrics:
        problems.append("the experiment lists no metric")
    for group, tag in metrics:
        if not any(tag in scalar_runs.get(os.path.join(run, group) if group else run, {}) for run in starts):
            problems.append(f"metric {tag!r} (group {group!r}) is logged by no session")

    # The sessions, as the table shows them.
    sessions = {}
    for g in groups.session_groups:
        for s in g.sessions:
            sessions[s.name] = (g, s)
    for run in sorted(starts):
        if run not in sessions:
            problems.append(f"{run}: has a session start but is not in the session groups TensorBoard lists")
    for name in sorted(set(starts) - set(members)):
        problems.append(f"{name}: a session that summary.json does not list as a member")

    rows = []
    for name, expected in members.items():
        if name not in starts:
            rows.append((name, "no session", "", {}))
            continue
        written = {k: proto_value(v) for k, v in starts[name].hparams.items()}
        for label, got in [("session start", written)] + (
            [("table row", {k: proto_value(v) for k, v in sessions[name][0].hparams.items()})]
            if name in sessions
            else []
        ):
            if set(got) != set(expected):
                problems.append(f"{name}: {label} has hyper-parameters {sorted(got)}, summary.json {sorted(expected)}")
            for k in sorted(set(got) & set(expected)):
                if not same(expected[k], got[k]):
                    problems.append(f"{name}: {label} has {k} = {got[k]!r}, summary.json {expected[k]!r}")
        status = api_pb2.Status.Name(sessions[name][1].status) if name in sessions else "?"
        values = (
            {mv.name.tag: mv.value for mv in sessions[name][1].metric_values} if name in sessions else {}
        )
        rows.append((name, status.replace("STATUS_", "").lower(), written, values))

    print(f"experiment: {len(hparam_infos)} hparams ({', '.join(hparam_infos)}), "
          f"{len(metrics)} metrics ({', '.join(t for _, t in metrics)})")
    print(f"sessions: {len(sessions)} in {len(groups.session_groups)} groups; members in summary.json: {len(members)}")
    tags = [t for _, t in metrics]
    header = ["member", "status", "hparams"] + tags
    table = [header] + [
        [name, status, " ".join(f"{k}={show(v)}" for k, v in sorted(hp.items()))]
        + [show(values[t]) if t in values else "-" for t in tags]
        for name, status, hp, values in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if problems:
        print(f"FAIL: {len(problems)} mismatch(es)")
        for p in problems:
            print(f"  {p}")
        return 1
    print("OK: TensorBoard's HParams backend sees every member with its hyper-parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
