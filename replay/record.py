"""Writing a simulated run's event log: the live recorder's Parquet schema, plus `run.json`.

Rows are built by the recorder's own row builder (`controlplane.recorder.rows.row_of`) and written
by its atomic writer, `ROLL_ROWS` rows per file, so a simulated log reads exactly like a live one
(`rubick log`, `controlplane.eventlog`). The stream's stored time is the event's virtual time.

`run.json` (beside the Parquet files) holds the run's configuration, the performance-model
parameters the cores started from, which core produced which event sources, and a manifest of the
files (rows, sequence range, size, sha256: the entries of the log's own `manifest-<stream>.jsonl`), so
replay can rebuild the cores and name a missing or changed file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from controlplane.recorder import manifest as written
from controlplane.recorder.rows import row_of
from controlplane.recorder.writer import write_atomic

from .config import RUN_FILE

ROLL_ROWS = 200_000
FORMAT = 1


def stream_token(config: Mapping[str, Any]) -> str:
    """The log files' stream token: a digest of the configuration (deterministic, [0-9a-f]{10})."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]


def write_log(log_dir: Path, records: Iterable[tuple[str, bytes, float]], *, config: Mapping[str, Any],
              params: Mapping[str, Any], sources: Mapping[str, list[str]], roll_rows: int = ROLL_ROWS,
              extra: Mapping[str, Any] | None = None) -> list[Path]:
    """Write (subject, wire bytes, time) records, sequence from 1, and run.json; returns the files."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    stream = stream_token(config)
    files, rows = [], []
    for old in log_dir.glob(f"{written.PREFIX}*{written.SUFFIX}"):  # an earlier run's: replaced
        old.unlink()

    def flush() -> None:
        files.append(write_atomic(log_dir, stream, rows))  # listed in the log's manifest as it is written
        rows.clear()

    for seq, (subject, data, t) in enumerate(records, start=1):
        rows.append(row_of(seq, subject, data, None, t))
        if len(rows) >= roll_rows:
            flush()
    if rows:
        flush()
    found = written.read(log_dir, stream)
    run = {"format": FORMAT, "config": dict(config), "params": params, "sources": dict(sources),
           "stream": stream, "files": found.entries if found is not None else [], **(extra or {})}
    tmp = log_dir / f".tmp-{RUN_FILE}"
    tmp.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    tmp.replace(log_dir / RUN_FILE)
    kept = {p.name for p in files}
    for old in log_dir.glob("events-*.parquet"):  # an earlier run written to the same folder: replaced
        if old.name not in kept:
            old.unlink()
    return files


def read_run(log_dir: Path) -> dict[str, Any]:
    """run.json of a log folder, else the record its `run.described` events give (a deployment of
    separate services, `replay.live.run_from_log`); FileNotFoundError (neither) or ValueError (corrupt)
    otherwise."""
    path = Path(log_dir) / RUN_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        from .live import run_from_log

        run = run_from_log(log_dir) if Path(log_dir).is_dir() else None
        if run is None:
            raise
        return run
    data = json.loads(text)
    if not isinstance(data, dict) or "config" not in data:
        raise ValueError(f"{path}: not a run description (no 'config')")
    return data
