"""Reading the Parquet event log.

A file that cannot be read (truncated, corrupt) or that is not an event-log file
(foreign columns) is reported by name and skipped, never fatal and never
silently dropped. Rows are de-duplicated on (stream, seq) and ordered by the
time the stream stored them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import polars as pl

from .events import Event, Invalid, decode
from .recorder.rows import SCHEMA
from .recorder.writer import FILE_RE, TMP_PREFIX


@dataclass
class LogScan:
    frame: pl.DataFrame
    files: list[Path] = field(default_factory=list)
    problems: list[tuple[Path, str]] = field(default_factory=list)
    bytes_on_disk: int = 0


def _empty() -> pl.DataFrame:
    return pl.DataFrame(schema={**SCHEMA, "stream": pl.Utf8()})


def scan(log_dir: str | Path, columns: list[str] | None = None) -> LogScan:
    log_dir = Path(log_dir)
    if not log_dir.exists():
        raise FileNotFoundError(f"no event log at {log_dir}")
    if log_dir.is_file():
        paths = [log_dir]
    else:
        paths = sorted(p for p in log_dir.iterdir() if p.is_file() and (p.suffix == ".parquet"
                                                                         or p.name.startswith(TMP_PREFIX)))
    want = list(SCHEMA) if columns is None else sorted(set(columns) | {"seq", "stored"}, key=list(SCHEMA).index)
    frames, files, problems, size = [], [], [], 0
    for path in paths:
        if path.name.startswith(TMP_PREFIX):
            problems.append((path, "incomplete temporary file from an interrupted write (its messages were "
                                   "not acknowledged and are recorded again); skipped"))
            continue
        try:
            schema = pl.read_parquet_schema(path)
        except Exception as exc:
            problems.append((path, f"unreadable Parquet (truncated or corrupt: {_one_line(exc)}); skipped"))
            continue
        missing = [c for c in want if c not in schema]
        if missing:
            problems.append((path, f"not an event-log file (missing columns {', '.join(missing)}); skipped"))
            continue
        try:
            df = pl.read_parquet(path, columns=want)
            df = df.cast({c: SCHEMA[c] for c in want})
        except Exception as exc:
            problems.append((path, f"unreadable Parquet (truncated or corrupt: {_one_line(exc)}); skipped"))
            continue
        m = FILE_RE.match(path.name)
        frames.append(df.with_columns(pl.lit(m["stream"] if m else path.stem).alias("stream")))
        files.append(path)
        size += path.stat().st_size
    if frames:
        frame = pl.concat(frames, how="vertical")
        frame = frame.unique(subset=["stream", "seq"], keep="first", maintain_order=True)
        frame = frame.sort(["stored", "seq"], maintain_order=True)
    else:
        frame = _empty().select([*want, "stream"])
    return LogScan(frame, files, problems, size)


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
