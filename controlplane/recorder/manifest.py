"""The event log's file manifest: what each Parquet file of a stream held when it was written.

`manifest-<stream>.jsonl` beside the files has one JSON line per file, in the order they were written:
`{"name", "rows", "first_seq", "last_seq", "bytes", "sha256"}` (the entries of run.json's `files`, plus
the size). The writer appends a file's line, flushed to disk, before it renames the file into place, so
every event file in the folder is listed; a crash between the two leaves a line whose file is missing
and whose temporary is there, and the recorder drops that line when it starts (the messages come again).
A line torn by a crash while it was being appended is the last one; it is ignored when read and dropped
when the recorder starts. Readers compare the folder with the manifest (`controlplane.eventlog.check`)
and name a changed, truncated, missing or extra file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "manifest-"
SUFFIX = ".jsonl"
NAME_RE = re.compile(r"^manifest-(?P<stream>[0-9a-z]+)\.jsonl$")
KEYS = ("name", "rows", "first_seq", "last_seq", "bytes", "sha256")


def manifest_name(stream: str) -> str:
    return f"{PREFIX}{stream}{SUFFIX}"


def file_entry(path: Path, name: str, rows: int, first_seq: int, last_seq: int) -> dict[str, Any]:
    """The manifest line of a file (hashed as it is on disk at `path`, listed as `name`)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return {"name": name, "rows": rows, "first_seq": first_seq, "last_seq": last_seq, "bytes": size,
            "sha256": digest.hexdigest()}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Manifest:
    stream: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Lines that could not be read (a torn last line is not one of them)."""
    torn: bool = False
    """The last line is incomplete (a crash while it was appended)."""
    unterminated: bool = False
    """The file does not end with a newline (the next line must not be appended to it)."""


def _valid(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("sha256"), str)
            and all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool)
                    for k in ("rows", "first_seq", "last_seq")))


def read(log_dir: Path, stream: str) -> Manifest | None:
    """The stream's manifest, or None when the folder has none."""
    path = Path(log_dir) / manifest_name(stream)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    out = Manifest(stream, unterminated=bool(raw) and not raw.endswith(b"\n"))
    lines = raw.split(b"\n")
    last = len(lines) - 1
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if _valid(entry):
            out.entries.append(entry)
        elif n == last:  # no newline after it: it was being appended
            out.torn = True
        else:
            out.problems.append(f"line {n + 1} of {path.name} is not a file entry")
    return out


def streams(log_dir: Path) -> list[str]:
    """The streams the folder has a manifest for."""
    if not Path(log_dir).is_dir():
        return []
    return sorted(m["stream"] for p in Path(log_dir).iterdir() if (m := NAME_RE.match(p.name)))


def fsync_dir(log_dir: Path) -> None:
    """Make a folder's entries (renames, new and removed files) durable."""
    fd = os.open(log_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append(log_dir: Path, stream: str, entry: dict[str, Any]) -> None:
    """Add a file's line, flushed to disk."""
    path = Path(log_dir) / manifest_name(stream)
    new = not path.exists()
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    if new:
        fsync_dir(Path(log_dir))


def write(log_dir: Path, stream: str, entries: list[dict[str, Any]]) -> None:
    """Replace the stream's manifest atomically (temporary file, flushed, renamed)."""
    path = Path(log_dir) / manifest_name(stream)
    tmp = Path(log_dir) / f".tmp-{path.name}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(e, sort_keys=True) + "\n" for e in entries)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(Path(log_dir))


def repair(log_dir: Path, stream: str, interrupted: set[str]) -> list[str]:
    """At the recorder's start: drop the lines of files whose write was interrupted (`interrupted`: their
    names, from the temporaries removed; the file itself is missing) and a torn last line. Returns what
    was dropped, in words."""
    manifest = read(log_dir, stream)
    if manifest is None:
        return []
    dropped = [e for e in manifest.entries if e["name"] in interrupted and not (Path(log_dir) / e["name"]).exists()]
    notes = [f"{manifest_name(stream)}: dropped the line of {e['name']} (its write was interrupted)" for e in dropped]
    if manifest.torn:
        notes.append(f"{manifest_name(stream)}: dropped a torn last line (a crash while it was written)")
    if dropped or manifest.torn or manifest.unterminated:
        write(log_dir, stream, [e for e in manifest.entries if e not in dropped])
    return notes
