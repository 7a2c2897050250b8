"""Atomic Parquet files of the event log.

A file is written under a temporary name, flushed to disk, listed in the
stream's manifest (`manifest.py`: rows, sequences, size, sha256), and renamed, so
a crash never leaves a torn file: either the whole file is there or none of it,
and every file in place is in the manifest. Names carry the stream identity and the sequence range:
`events-<stream>-<first seq>-<last seq>.parquet`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl

from . import manifest
from .locks import manifest_lock
from .rows import safe_frame

FILE_RE = re.compile(r"^events-(?P<stream>[0-9a-z]+)-(?P<first>\d{12})-(?P<last>\d{12})\.parquet$")
TMP_PREFIX = ".tmp-"


def file_name(stream: str, first: int, last: int) -> str:
    return f"events-{stream}-{first:012d}-{last:012d}.parquet"


def recorded_max_seq(log_dir: Path, stream: str) -> int:
    """Highest stream sequence already in the log for this stream (0 if none)."""
    best = 0
    if not log_dir.exists():
        return 0
    for path in log_dir.iterdir():
        m = FILE_RE.match(path.name)
        if m and m["stream"] == stream:
            best = max(best, int(m["last"]))
    return best


def write_atomic(log_dir: Path, stream: str, rows: list[tuple], compression: str = "zstd") -> Path:
    """Write rows (in sequence order) to one new Parquet file, listed in the stream's manifest; returns
    its path."""
    log_dir.mkdir(parents=True, exist_ok=True)
    first, last = rows[0][0], rows[-1][0]
    final = log_dir / file_name(stream, first, last)
    tmp = log_dir / f"{TMP_PREFIX}{final.name}"
    safe_frame(rows).write_parquet(tmp, compression=compression, statistics=True)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    entry = manifest.file_entry(tmp, final.name, len(rows), first, last)
    with manifest_lock(log_dir):  # a compaction rewrites the manifest under the same lock
        manifest.append(log_dir, stream, entry)
        os.replace(tmp, final)
        dir_fd = os.open(log_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return final


def clean_temporaries(log_dir: Path) -> list[Path]:
    """Remove files left by a write that a crash interrupted (their messages were never acked)."""
    removed = []
    if log_dir.exists():
        for path in log_dir.iterdir():
            if path.name.startswith(TMP_PREFIX):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def read_rows(path: Path) -> pl.DataFrame:
    return pl.read_parquet(path)
