"""Reading the event log: bad files reported by name and skipped; `rubick log` filters and counts."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

from controlplane.cli import main
from controlplane.eventlog import events, scan
from controlplane.events import encode
from controlplane.recorder.rows import row_of
from controlplane.recorder.writer import write_atomic

from .samples import PAYLOADS, sample


@pytest.fixture
def log_dir(tmp_path):
    d = tmp_path / "events"
    rows = []
    for n, subject in enumerate(sorted(PAYLOADS)):
        e = sample(subject, n)
        rows.append(row_of(n + 1, subject, encode(e), e.id, 1_700_000_000.0 + n))
    write_atomic(d, "abc", rows[:7])
    write_atomic(d, "abc", rows[7:])
    return d


def test_truncated_foreign_and_temporary_files_are_reported_and_skipped(log_dir, tmp_path):
    good = scan(log_dir)
    assert good.problems == [] and good.frame.height == len(PAYLOADS)
    first = sorted(log_dir.glob("events-*.parquet"))[0]
    truncated = log_dir / "events-abc-000000000100-000000000200.parquet"
    truncated.write_bytes(first.read_bytes()[: first.stat().st_size // 2])
    pl.DataFrame({"a": [1, 2]}).write_parquet(log_dir / "someone-elses.parquet")
    shutil.copy(first, log_dir / ".tmp-events-abc-000000000300-000000000301.parquet")
    result = scan(log_dir)
    reasons = {p.name: r for p, r in result.problems}
    assert "truncated or corrupt" in reasons[truncated.name]
    assert "not an event-log file" in reasons["someone-elses.parquet"]
    assert "interrupted write" in reasons[".tmp-events-abc-000000000300-000000000301.parquet"]
    assert result.frame.height == len(PAYLOADS)  # nothing of the good files lost


def test_duplicate_rows_across_files_are_read_once(log_dir):
    first = sorted(log_dir.glob("events-*.parquet"))[0]
    shutil.copy(first, log_dir / "events-abc-000000000001-000000000099.parquet")
    assert scan(log_dir).frame.height == len(PAYLOADS)


def test_events_decode_in_order(log_dir):
    decoded = events(log_dir)
    assert [e.subject for e in decoded.events] == sorted(PAYLOADS)
    assert decoded.undecodable == [] and decoded.problems == []


def test_log_show_filters(log_dir, capsys):
    assert main(["log", "show", str(log_dir), "--subject", "job.*", "-n", "0"]) == 0
    out = capsys.readouterr().out
    assert "job.submitted" in out and "node.registered" not in out and "clock.tick" not in out
    assert main(["log", "show", str(log_dir), "--job", "bert-0002"]) == 0
    out = capsys.readouterr().out
    assert "plan.decided" in out and "job.submitted" not in out
    assert main(["log", "show", str(log_dir), "--node", "node-0", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert {l.split('"subject": "')[1].split('"')[0] for l in lines} == \
        {"node.registered", "node.heartbeat", "node.lost", "metrics.iteration"}


def test_log_tail_and_time_window(log_dir, capsys):
    assert main(["log", "tail", str(log_dir), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert all(subject in out for subject in sorted(PAYLOADS)[-2:])  # the last two subjects alphabetically
    assert main(["log", "show", str(log_dir), "--since", "1700000003", "--until", "1700000004", "--json"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    assert main(["log", "show", str(log_dir), "--since", "yesterday"]) == 2


def test_log_stats_counts_and_reports_bad_files(log_dir, capsys):
    (log_dir / "events-abc-000000000100-000000000200.parquet").write_bytes(b"PAR1 broken")
    assert main(["log", "stats", str(log_dir)]) == 0
    captured = capsys.readouterr()
    assert f"events: {len(PAYLOADS)}" in captured.out
    assert "1 skipped" in captured.out
    assert "events-abc-000000000100-000000000200.parquet" in captured.err and "skipped" in captured.err


def test_log_of_a_missing_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["log", "show", str(tmp_path / "nope")]) == 2
    assert "no event log" in capsys.readouterr().err
