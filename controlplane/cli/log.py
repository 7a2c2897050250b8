"""`rubick log show|tail|stats <dir>`: read the Parquet event log (`rubick log compact`: `log_compact.py`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from ..bus.base import subject_matches
from ..eventlog import check, scan
from ..events import Invalid, decode
from ..events.schema import to_plain
from ..recorder.manifest import PREFIX, SUFFIX
from .common import fail

SHOWN = ["seq", "stored", "subject", "job_id", "node", "model_type", "iter_time_s", "plan", "error"]


def register(sub) -> None:
    p = sub.add_parser("log", help="inspect the Parquet event log")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, text in (("show", "rows of the log (oldest first)"), ("tail", "the newest rows"),
                       ("stats", "counts per subject, files, size, time span")):
        v = verbs.add_parser(verb, help=text)
        v.add_argument("dir", type=Path, help="event-log folder (e.g. .rubick/events) or one Parquet file")
        v.add_argument("--subject", help="subject or NATS wildcard (job.*, job.>, plan.decided.>)")
        v.add_argument("--job", help="only rows about this job")
        v.add_argument("--node", help="only rows about this node")
        v.add_argument("--model", help="only rows about this model type")
        v.add_argument("--since", help="from this time (ISO 8601 or seconds since the epoch)")
        v.add_argument("--until", help="up to this time (ISO 8601 or seconds since the epoch)")
        if verb != "stats":
            v.add_argument("-n", "--limit", type=int, default=50 if verb == "show" else 20,
                           help="rows to print (0 = all)")
            v.add_argument("--json", action="store_true", help="JSON lines with the decoded event")
        if verb == "tail":
            v.add_argument("-f", "--follow", action="store_true", help="keep printing new rows")
        v.set_defaults(func=run)
    from .log_compact import register as register_compact

    register_compact(verbs)


def _time(text: str | None, what: str) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromtimestamp(float(text), tz=timezone.utc)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--{what}: not a time: {text!r} (ISO 8601 or seconds since the epoch)") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def filtered(frame: pl.DataFrame, args: argparse.Namespace) -> pl.DataFrame:
    if args.subject:
        subjects = frame.get_column("subject").unique().to_list()
        keep = [s for s in subjects if s is not None and (subject_matches(args.subject, s) or s == args.subject)]
        frame = frame.filter(pl.col("subject").is_in(keep))
    if args.job:
        frame = frame.filter((pl.col("job_id") == args.job) | pl.col("jobs").list.contains(args.job))
    if args.node:
        frame = frame.filter(pl.col("node") == args.node)
    if args.model:
        frame = frame.filter(pl.col("model_type") == args.model)
    since, until = _time(args.since, "since"), _time(args.until, "until")
    if since:
        frame = frame.filter(pl.col("stored") >= since)
    if until:
        frame = frame.filter(pl.col("stored") <= until)
    return frame


def _report(problems) -> None:
    for path, reason in problems:
        print(f"warning: {path}: {reason}", file=sys.stderr)


def log_folder(path: Path) -> Path | None:
    """The event log a path names: the folder or file itself, or the `events` folder of a data folder
    (`rubick up`'s, or a simulated run's); None when it holds no log."""
    def holds_log(folder: Path) -> bool:
        return folder.is_dir() and (any(folder.glob("*.parquet")) or any(folder.glob(f"{PREFIX}*{SUFFIX}"))
                                    or (folder / "run.json").exists())
    path = Path(path)
    if path.is_file() or holds_log(path):
        return path
    if holds_log(path / "events"):
        return path / "events"
    return None


def run(args: argparse.Namespace) -> int:
    found = log_folder(args.dir)
    if found is None:
        return fail(f"no event log in {args.dir}" + ("" if Path(args.dir).exists() else " (no such folder)")
                    + ": give the events folder of a run (e.g. .rubick/events, runs/NAME/events)")
    args.dir = found
    try:
        result = scan(args.dir)
        frame = filtered(result.frame, args)
    except (FileNotFoundError, ValueError) as exc:
        return fail(str(exc))
    _report(result.problems + check(args.dir))
    if args.verb == "stats":
        return _stats(frame, result)
    matched = frame.height
    if args.verb == "tail":
        frame = frame.tail(args.limit) if args.limit else frame
    else:
        frame = frame.head(args.limit) if args.limit else frame
    _print_rows(frame, args.json)
    if frame.height < matched:
        print(f"{'last' if args.verb == 'tail' else 'first'} {frame.height} of {matched} rows "
              f"(-n N for more, -n 0 for all)", file=sys.stderr)
    if args.verb == "tail" and args.follow:
        return _follow(args, int(frame["seq"].max() or 0) if frame.height else 0)
    return 0


def _print_rows(frame: pl.DataFrame, as_json: bool) -> None:
    if as_json:
        for row in frame.iter_rows(named=True):
            try:
                event = to_plain(decode(row["data"], row["subject"]).payload)
            except Invalid as exc:
                event = {"invalid": str(exc)}
            out = {k: row[k] for k in SHOWN if row[k] is not None}
            out["stored"] = row["stored"].isoformat()
            out["event_id"] = row["event_id"]
            out["payload"] = event
            print(json.dumps(out, default=str))
        return
    with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=48, tbl_width_chars=200,
                   tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        print(frame.select(SHOWN))


def _follow(args: argparse.Namespace, last_seq: int) -> int:
    try:
        while True:
            time.sleep(1.0)
            frame = filtered(scan(args.dir).frame, args).filter(pl.col("seq") > last_seq)
            if frame.height:
                _print_rows(frame, args.json)
                last_seq = int(frame["seq"].max())
    except KeyboardInterrupt:
        return 0


def _stats(frame: pl.DataFrame, result) -> int:
    n = frame.height
    print(f"files: {len(result.files)} ({result.bytes_on_disk:,} bytes)"
          + (f", {len(result.problems)} skipped (see warnings)" if result.problems else ""))
    print(f"events: {n:,}" + (f", {result.bytes_on_disk / result.frame.height:.1f} bytes/event on disk"
                              if result.frame.height else ""))
    if n:
        print(f"stored from {frame['stored'].min()} to {frame['stored'].max()}")
        errors = frame.filter(pl.col("error").is_not_null()).height
        print(f"rows that are not valid envelopes: {errors}")
        counts = frame.group_by("subject").agg(pl.len().alias("events")).sort(["events", "subject"],
                                                                             descending=[True, False])
        with pl.Config(tbl_rows=-1, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
            print(counts)
    return 0
