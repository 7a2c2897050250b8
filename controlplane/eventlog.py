"""Reading the Parquet event log.

A file that cannot be read (truncated, corrupt) or that is not an event-log file
(foreign columns) is reported by name and skipped, never fatal and never
silently dropped. Rows are de-duplicated on (stream, seq) and ordered by the
time the stream stored them.

`check` compares the folder with its manifest (run.json's `files` where it lists
some, else the recorder's `manifest-<stream>.jsonl`) and names every changed,
truncated, missing or extra file. A compaction (`controlplane.recorder.compact`)
keeps both clean at every step: its temporary is skipped (its rows are in the
files it merges until it is renamed into place), and a file a listed entry names
under `merged` is checked against that entry instead of counted as extra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import polars as pl

from .events import Event, Invalid, decode
from .recorder import manifest
from .recorder.compact import COMPACT_PREFIX
from .recorder.rows import SCHEMA
from .recorder.writer import FILE_RE, TMP_PREFIX

READ_ERRORS = (Exception, pl.exceptions.PanicException)
"""What reading a corrupt Parquet file may raise (a panic in polars' reader is not an `Exception`)."""

RUN_FILE = "run.json"
"""A run's description beside its log (`replay.config.RUN_FILE`); its `files` are the run's manifest."""


@dataclass
class LogScan:
    frame: pl.DataFrame
    files: list[Path] = field(default_factory=list)
    problems: list[tuple[Path, str]] = field(default_factory=list)
    bytes_on_disk: int = 0


def _empty() -> pl.DataFrame:
    return pl.DataFrame(schema={**SCHEMA, "stream": pl.Utf8()})


class _Vanished(Exception):
    """A file went away while it was read (a compaction merged it into a file now in place)."""


RETRIES = 5
PASSES = 100


def scan(log_dir: str | Path, columns: list[str] | None = None) -> LogScan:
    """Every row of the log once. A file that a compaction removes while it is read has its rows in the
    merged file, which is in place before its sources are removed: the folder is listed again and the
    files not read yet are read too (the rows both hold are kept once)."""
    log_dir = Path(log_dir)
    if not log_dir.exists():
        raise FileNotFoundError(f"no event log at {log_dir}")
    want = list(SCHEMA) if columns is None else sorted(set(columns) | {"seq", "stored"}, key=list(SCHEMA).index)
    frames, files, problems, size = [], [], [], 0
    seen: set[str] = set()
    for _ in range(PASSES):
        paths = [log_dir] if log_dir.is_file() else sorted(
            p for p in log_dir.iterdir() if p.suffix == ".parquet" and p.name not in seen and p.is_file())
        vanished = False
        for path in paths:
            seen.add(path.name)
            try:
                found = _read(path, want)
            except _Vanished:
                vanished = True
                continue
            if found is None:
                continue
            if isinstance(found, str):
                problems.append((path, found))
                continue
            df, nbytes = found
            nulls = df["seq"].null_count()
            if nulls:  # not rows the recorder wrote: it numbers every one
                problems.append((path, f"{nulls} row(s) without a stream sequence; those rows skipped"))
                df = df.filter(pl.col("seq").is_not_null())
            m = FILE_RE.match(path.name)
            frames.append(df.with_columns(pl.lit(m["stream"] if m else path.stem).alias("stream")))
            files.append(path)
            size += nbytes
        if not vanished:
            break
    else:
        raise RuntimeError(f"{log_dir}: its files kept changing while they were read; read it again")
    if frames:
        frame = pl.concat(frames, how="vertical")
        frame = frame.unique(subset=["stream", "seq"], keep="first", maintain_order=True)
        frame = frame.sort(["stored", "seq"], maintain_order=True)
    else:
        frame = _empty().select([*want, "stream"])
    return LogScan(frame, files, problems, size)


def _read(path: Path, want: list[str]) -> tuple[pl.DataFrame, int] | str | None:
    """A file's frame and size, or why it is skipped (None: skipped quietly); `_Vanished` when it went away meanwhile."""
    if path.name.startswith(COMPACT_PREFIX):
        return None  # a merged file being written: its rows are in the files it merges until it is renamed
    if path.name.startswith(TMP_PREFIX):
        return ("incomplete temporary file from an interrupted write (its messages were not acknowledged and "
                "are recorded again); skipped")
    try:
        nbytes = path.stat().st_size
        schema = pl.read_parquet_schema(path)
    except READ_ERRORS as exc:
        if not path.exists():
            raise _Vanished(path) from None
        return f"unreadable Parquet (truncated or corrupt: {_one_line(exc)}); skipped"
    missing = [c for c in want if c not in schema]
    if missing:
        return f"not an event-log file (missing columns {', '.join(missing)}); skipped"
    try:
        df = pl.read_parquet(path, columns=want)
        df = df.cast({c: SCHEMA[c] for c in want})
    except READ_ERRORS as exc:
        if not path.exists():
            raise _Vanished(path) from None
        return f"unreadable Parquet (truncated or corrupt: {_one_line(exc)}); skipped"
    return df, nbytes


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else type(exc).__name__


@dataclass
class DecodedLog:
    events: list[Event]
    undecodable: list[tuple[int, str, str]]
    """(seq, subject, reason) of rows that are not valid events."""
    problems: list[tuple[Path, str]]


def events(log_dir: str | Path) -> DecodedLog:
    """Every valid event of the log in recorded order (for folds and replay)."""
    result = scan(log_dir, ["subject", "data"])
    out: list[Event] = []
    bad: list[tuple[int, str, str]] = []
    for seq, subject, data in result.frame.select("seq", "subject", "data").iter_rows():
        try:
            out.append(decode(data, subject))
        except Invalid as exc:
            bad.append((seq, subject, str(exc)))
    return DecodedLog(out, bad, result.problems)


def iter_events(log_dir: str | Path) -> Iterator[Event]:
    yield from events(log_dir).events


def run_files(log_dir: str | Path) -> list[dict[str, Any]] | None:
    """The `files` run.json lists, or None when there is no run.json or it lists none."""
    try:
        run = json.loads((Path(log_dir) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    files = run.get("files") if isinstance(run, dict) else None
    return files if isinstance(files, list) and files else None


def check(log_dir: str | Path, listed: list[dict[str, Any]] | None = None) -> list[tuple[Path, str]]:
    """Every file of the folder that differs from its manifest, with why: changed or truncated (size or
    sha256 differ), missing, or extra (an event file the manifest does not list). The manifest is
    `listed` (run.json's `files`) where given, else run.json's, else the recorder's manifests. A file
    listed but still being written (its temporary is there) is not a problem. Nothing to compare with
    (no manifest at all) gives no problems. Where a manifest changes while the folder is compared with it (a
    compaction), the comparison is made again."""
    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        return []
    for _ in range(RETRIES):
        before = _manifests_state(log_dir)
        problems = _check(log_dir, listed)
        if _manifests_state(log_dir) == before:
            return problems
    return problems


def _manifests_state(log_dir: Path) -> list[tuple[str, int, int, int]]:
    out = []
    for path in sorted(log_dir.iterdir()):
        if path.name == RUN_FILE or manifest.NAME_RE.match(path.name):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            out.append((path.name, st.st_ino, st.st_mtime_ns, st.st_size))
    return out


def _check(log_dir: Path, listed: list[dict[str, Any]] | None) -> list[tuple[Path, str]]:
    listed = listed if listed else run_files(log_dir)
    expected: dict[str, dict[str, dict[str, Any]]] = {}
    labels: dict[str, str] = {}
    problems: list[tuple[Path, str]] = []
    if listed:
        for entry in listed:
            m = FILE_RE.match(str(entry.get("name", ""))) if isinstance(entry, dict) else None
            if m is None:
                problems.append((log_dir / RUN_FILE, f"a file entry that is not an event file: {entry!r:.100}"))
                continue
            expected.setdefault(m["stream"], {})[entry["name"]] = entry
            labels[m["stream"]] = "the run's manifest"
    else:
        for stream in manifest.streams(log_dir):
            found = manifest.read(log_dir, stream)
            if found is None:
                continue
            name = manifest.manifest_name(stream)
            problems.extend((log_dir / name, why) for why in found.problems)
            expected[stream] = {e["name"]: e for e in found.entries}
            labels[stream] = f"the log's manifest ({name})"
    if not expected:
        return problems
    merging: dict[str, tuple[dict[str, Any], str]] = {}
    for stream, entries in sorted(expected.items()):
        for name, entry in sorted(entries.items()):
            problem = _differs(log_dir, entry, labels[stream])
            if problem is not None:
                problems.append((log_dir / name, problem))
            for source in entry.get("merged") or ():
                if isinstance(source, dict) and isinstance(source.get("name"), str):
                    merging[source["name"]] = (source, name)
    for path in sorted(p for p in log_dir.iterdir() if p.suffix == ".parquet" and p.is_file()
                       and not p.name.startswith(TMP_PREFIX)):  # a temporary: scan() names it
        m = FILE_RE.match(path.name)
        if m is not None and m["stream"] in expected:
            if path.name in merging and path.name not in expected[m["stream"]]:  # being merged: still checked
                source, into = merging[path.name]
                problem = _differs(log_dir, source, f"{labels[m['stream']]}, which merges it into {into}")
                if problem is not None and not problem.startswith("missing"):  # gone meanwhile: merged
                    problems.append((path, problem))
            elif path.name not in expected[m["stream"]]:
                problems.append((path, f"not in {labels[m['stream']]}: an extra file"))
        else:
            problems.append((path, "not in any manifest of this folder: an extra file"))
    return problems


def _differs(log_dir: Path, entry: dict[str, Any], label: str) -> str | None:
    path = log_dir / entry["name"]
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        if (log_dir / f"{TMP_PREFIX}{entry['name']}").exists() or (log_dir / f"{COMPACT_PREFIX}{entry['name']}").exists():
            return None  # listed just before it is renamed into place (written, or merged by a compaction)
        return f"missing (events {entry.get('first_seq')}..{entry.get('last_seq')} in {label})"
    want = entry.get("bytes")
    if isinstance(want, int) and size != want:
        how = f"truncated: {size:,} of its {want:,} bytes" if size < want else f"{size:,} bytes, not {want:,}"
        return f"its bytes differ from {label} ({how})"
    try:
        digest = manifest.sha256_of(path)
    except FileNotFoundError:
        return f"missing (events {entry.get('first_seq')}..{entry.get('last_seq')} in {label})"
    if digest != entry.get("sha256"):
        return f"its bytes differ from {label} (changed or corrupt)"
    return None
