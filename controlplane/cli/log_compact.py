"""`rubick log compact DIR [--target-rows N]`: merge the event log's small files (docs/eventlog.md).

Refuses (exit 2, nothing changed) a folder with no log, a log whose files differ from its manifest, and
a log a live recorder writes (it holds the folder's recording lock, or a file is being written); a
merge a crash interrupted is finished first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..eventlog import check
from ..recorder import compact, locks, manifest
from ..recorder.writer import TMP_PREFIX
from .common import fail

DEFAULT_TARGET_ROWS = 200_000
"""The recorder's default `--roll-rows`."""


def register(verbs) -> None:
    v = verbs.add_parser("compact", help="merge consecutive small files into larger ones")
    v.add_argument("dir", type=Path, help="event-log folder (e.g. .rubick/events)")
    v.add_argument("--target-rows", type=int, default=DEFAULT_TARGET_ROWS,
                   help=f"rows per merged file at most (default {DEFAULT_TARGET_ROWS:,}, the recorder's --roll-rows)")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .log import log_folder

    if args.target_rows < 2:
        return fail(f"--target-rows must be at least 2, not {args.target_rows}")
    found = log_folder(args.dir)
    if found is None or not found.is_dir():
        return fail(f"no event log in {args.dir}" + ("" if Path(args.dir).exists() else " (no such folder)"))
    streams = manifest.streams(found)
    if not streams:
        return fail(f"{found}: no manifest (manifest-<stream>.jsonl): its files cannot be merged safely")
    writing = sorted(p.name for p in found.iterdir()
                     if p.name.startswith(TMP_PREFIX) and not p.name.startswith(compact.COMPACT_PREFIX)
                     and p.suffix == ".parquet")
    if writing:
        return fail(f"{found}: {writing[0]} is being written (by a live recorder, or one that crashed: "
                    "start it again to clean up); nothing changed")
    problems = check(found)
    if problems:
        for path, why in problems:
            print(f"problem: {path.name}: {why}")
        return fail(f"{found}: its files differ from its manifest ({len(problems)} problem(s)); nothing changed")
    try:
        alone = locks.hold_alone(found)
    except locks.Busy:
        return fail(f"{found}: a recorder is recording into it; stop it first (it compacts its log itself "
                    "unless started with --no-compact); nothing changed")
    try:
        return _compact(found, streams, args.target_rows)
    finally:
        locks.release(alone)


def _compact(log_dir: Path, streams: list[str], target_rows: int) -> int:
    before = after = 0
    for stream in streams:
        for note in compact.recover(log_dir, stream):
            print(f"recovered: {note}")
        files = len(manifest.read(log_dir, stream).entries)
        try:
            merges = compact.compact(log_dir, stream, target_rows)
        except compact.CompactError as exc:
            return fail(f"{log_dir}: {exc}")
        for m in merges:
            print(f"{m.sources[0]} .. {m.sources[-1]} ({len(m.sources)} files, {m.rows:,} rows) -> {m.name}")
        before += files
        after += len(manifest.read(log_dir, stream).entries)
    problems = check(log_dir)
    for path, why in problems:
        print(f"problem: {path.name}: {why}")
    print(f"compacted {log_dir}: {before} files -> {after} files (target {target_rows:,} rows per file)")
    return 2 if problems else 0
