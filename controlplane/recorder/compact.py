"""Compaction of the event log: consecutive small files of a stream merged into larger ones.

A merge of sources A1..An (consecutive in stream sequence, each under `target_rows`, together at most
`target_rows`) into M = `events-<stream>-<first seq of A1>-<last seq of An>.parquet` goes step by step
(`STEPS`); a crash (kill -9) may stop it before any of them:

1. write: the sources are read (each checked against its manifest sha256), their rows written in
   sequence order to `.tmp-compact-<M>`, flushed to disk.
2. commit: the stream's manifest is rewritten atomically (temporary, fsync, rename) with M's entry in
   place of the sources' entries; M's entry keeps them under `merged`. This is the one step that
   decides: before it the sources are the log, after it M is.
3. run_json: the same in run.json's `files`, where it lists the sources.
4. rename: `.tmp-compact-<M>` renamed to M.
5. delete: the sources removed.
6. settle: `merged` dropped from M's entries.

At every instant each row is in the log once: a listed file whose temporary is still there is being
written, and a file named in a listed entry's `merged` (its bytes checked against that entry) is being
merged (`controlplane.eventlog.check` accepts both); where M and its sources are both in place, readers
keep one row per sequence. `recover` (run when the recorder starts and by `rubick log compact`) finishes
a committed merge (steps 4-6), rolls back one whose temporary is gone while its sources are intact, and
removes a temporary no manifest lists (a merge that never committed).

`plan` is the pure part: which files to merge.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import polars as pl

from . import manifest
from .locks import manifest_lock
from .writer import FILE_RE, file_name

COMPACT_PREFIX = ".tmp-compact-"
RUN_FILE = "run.json"
STEPS = ("write", "commit", "run_json", "rename", "delete", "settle")

Hook = Callable[[str], None]
"""Called with each step's name just before the step (tests raise there to stop a merge)."""


class CompactError(Exception):
    """A log that cannot be compacted safely (nothing was changed)."""


@dataclass(frozen=True)
class Merge:
    sources: tuple[str, ...]
    name: str
    rows: int


# --- the pure part -------------------------------------------------------------------------------------

def plan(entries: list[dict[str, Any]], target_rows: int, present: set[str]) -> list[list[dict[str, Any]]]:
    """Groups of at least two consecutive small files (under `target_rows` rows, in place, not being
    merged) whose rows together are at most `target_rows`, in sequence order."""
    groups: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    rows = 0

    def close() -> None:
        if len(current) >= 2:
            groups.append(list(current))

    for entry in sorted(entries, key=lambda e: e["first_seq"]):
        small = entry["rows"] < target_rows and entry["name"] in present and "merged" not in entry
        if small and current and rows + entry["rows"] <= target_rows and entry["first_seq"] > current[-1]["last_seq"]:
            current.append(entry)
            rows += entry["rows"]
            continue
        close()
        current, rows = ([entry], entry["rows"]) if small else ([], 0)
    close()
    return groups


def small_files(entries: list[dict[str, Any]], target_rows: int) -> int:
    return sum(1 for e in entries if e["rows"] < target_rows and "merged" not in e)


def merged_into(entries: list[dict[str, Any]], merged: dict[str, Any]) -> list[dict[str, Any]]:
    """`entries` with the sources of `merged` (its `merged` list) replaced by it, where the first was."""
    names = {s["name"] for s in merged["merged"]}
    out, placed = [], False
    for entry in entries:
        if entry["name"] in names or entry["name"] == merged["name"]:
            if not placed:
                out.append(merged)
                placed = True
            continue
        out.append(entry)
    return out


def settled(entries: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "merged"} if e["name"] == name else e for e in entries]


def rolled_back(entries: list[dict[str, Any]], merged: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        out.extend(merged["merged"] if entry["name"] == merged["name"] else [entry])
    return out


# --- the files -----------------------------------------------------------------------------------------

def _read_run(log_dir: Path) -> dict[str, Any] | None:
    try:
        run = json.loads((log_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return run if isinstance(run, dict) and isinstance(run.get("files"), list) else None


def _write_run(log_dir: Path, run: dict[str, Any]) -> None:
    tmp = log_dir / f".tmp-{RUN_FILE}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(run, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, log_dir / RUN_FILE)
    manifest.fsync_dir(log_dir)


def _update_run(log_dir: Path, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
    """Apply `change` to run.json's `files` (only where it lists files), atomically."""
    run = _read_run(log_dir)
    if run is None or not run["files"]:
        return
    files = change(list(run["files"]))
    if files != run["files"]:
        _write_run(log_dir, {**run, "files": files})


def _write_merged(log_dir: Path, sources: list[dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    frames = []
    for entry in sources:
        raw = (log_dir / entry["name"]).read_bytes()
        if hashlib.sha256(raw).hexdigest() != entry.get("sha256"):
            raise CompactError(f"{entry['name']}: its bytes differ from the manifest; not merged")
        frames.append(pl.read_parquet(io.BytesIO(raw)))
    merged = pl.concat(frames, how="vertical").sort("seq", maintain_order=True)
    rows = sum(e["rows"] for e in sources)
    if merged.height != rows or merged["seq"].n_unique() != rows:
        raise CompactError(f"{sources[0]['name']}..: {merged.height} rows read, the manifest lists {rows}; not merged")
    stream = FILE_RE.match(sources[0]["name"])["stream"]
    name = file_name(stream, sources[0]["first_seq"], sources[-1]["last_seq"])
    tmp = log_dir / f"{COMPACT_PREFIX}{name}"
    merged.write_parquet(tmp, compression="zstd", statistics=True)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    entry = manifest.file_entry(tmp, name, rows, sources[0]["first_seq"], sources[-1]["last_seq"])
    entry["merged"] = [{k: v for k, v in s.items() if k != "merged"} for s in sources]
    return tmp, entry


def _finish(log_dir: Path, stream: str, entry: dict[str, Any], hook: Hook) -> None:
    """Steps 4-6 of a committed merge (each may already be done)."""
    final, tmp = log_dir / entry["name"], log_dir / f"{COMPACT_PREFIX}{entry['name']}"
    hook("rename")
    if not final.exists():
        os.replace(tmp, final)
        manifest.fsync_dir(log_dir)
    hook("delete")
    for source in entry["merged"]:
        (log_dir / source["name"]).unlink(missing_ok=True)
    manifest.fsync_dir(log_dir)
    hook("settle")
    with manifest_lock(log_dir):
        found = manifest.read(log_dir, stream)
        if found is not None and any(e.get("merged") for e in found.entries if e["name"] == entry["name"]):
            manifest.write(log_dir, stream, settled(found.entries, entry["name"]))
        _update_run(log_dir, lambda files: settled(merged_into(files, entry), entry["name"])
                    if any(f.get("name") in {s["name"] for s in entry["merged"]} | {entry["name"]} for f in files)
                    else files)


def merge(log_dir: Path, stream: str, sources: list[dict[str, Any]], hook: Hook = lambda step: None) -> Merge | None:
    """Merge `sources` (manifest entries, consecutive) into one file; None when the manifest changed
    meanwhile (nothing done)."""
    log_dir = Path(log_dir)
    hook("write")
    tmp, entry = _write_merged(log_dir, sources)
    names = [s["name"] for s in sources]
    with manifest_lock(log_dir):
        found = manifest.read(log_dir, stream)
        listed = {e["name"]: e for e in found.entries} if found is not None else {}
        if any(listed.get(s["name"]) != s for s in sources):
            tmp.unlink(missing_ok=True)
            return None
        hook("commit")
        manifest.write(log_dir, stream, merged_into(found.entries, entry))
        hook("run_json")
        _update_run(log_dir, lambda files: merged_into(files, entry)
                    if any(f.get("name") in set(names) for f in files) else files)
    _finish(log_dir, stream, entry, hook)
    return Merge(tuple(names), entry["name"], entry["rows"])


def compact(log_dir: Path, stream: str, target_rows: int, hook: Hook = lambda step: None,
            stop: Callable[[], bool] = lambda: False) -> list[Merge]:
    """Merge every group `plan` finds in the stream's manifest (until `stop()`)."""
    log_dir = Path(log_dir)
    found = manifest.read(log_dir, stream)
    if found is None:
        return []
    present = {p.name for p in log_dir.iterdir() if FILE_RE.match(p.name)}
    done = []
    for group in plan(found.entries, target_rows, present):
        if stop():
            break
        result = merge(log_dir, stream, group, hook)
        if result is not None:
            done.append(result)
    return done


def recover(log_dir: Path, stream: str) -> list[str]:
    """Resolve a merge a crash interrupted; returns what was done, in words."""
    log_dir = Path(log_dir)
    notes: list[str] = []
    found = manifest.read(log_dir, stream)
    run = _read_run(log_dir)
    pending = {e["name"]: e for e in (run or {}).get("files", []) if isinstance(e, dict) and e.get("merged")}
    pending.update({e["name"]: e for e in (found.entries if found else []) if e.get("merged")})
    for name, entry in sorted(pending.items()):
        final, tmp = log_dir / name, log_dir / f"{COMPACT_PREFIX}{name}"
        if not final.exists() and not (tmp.exists() and manifest.sha256_of(tmp) == entry["sha256"]):
            intact = all((log_dir / s["name"]).exists() and manifest.sha256_of(log_dir / s["name"]) == s["sha256"]
                         for s in entry["merged"])
            if not intact:
                notes.append(f"{name}: an interrupted merge that cannot be finished (its temporary and some of "
                             "its sources are gone); left as it is")
                continue
            with manifest_lock(log_dir):
                if found is not None:
                    manifest.write(log_dir, stream, rolled_back(manifest.read(log_dir, stream).entries, entry))
                _update_run(log_dir, lambda files: rolled_back(files, entry))
            tmp.unlink(missing_ok=True)
            notes.append(f"{name}: an interrupted merge rolled back (its temporary was gone; its "
                         f"{len(entry['merged'])} sources are kept)")
            continue
        _finish(log_dir, stream, entry, lambda step: None)
        notes.append(f"{name}: finished an interrupted merge of {len(entry['merged'])} files")
    for tmp in sorted(log_dir.glob(f"{COMPACT_PREFIX}events-*.parquet")):
        m = FILE_RE.match(tmp.name[len(COMPACT_PREFIX):])
        if m is not None and m["stream"] == stream:
            tmp.unlink()
            notes.append(f"removed {tmp.name}, a merge that never committed (its sources are the log)")
    return notes
