"""What a newcomer trips over on the command line: a pipe closed early, a data folder named where no
`rubick up` runs, a data folder given where an event-log folder is expected, a log shown in part, a
mistyped flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.cli import main
from controlplane.events import encode
from replay.record import write_log

from .samples import sample

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """A data folder as `rubick up` leaves it: the log in its `events` folder (120 events)."""
    records = [("clock.tick", encode(sample("clock.tick", i)), float(i)) for i in range(120)]
    write_log(tmp_path / "events", records, config={}, params={}, sources={})
    return tmp_path


def rubick(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "controlplane.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_a_pipe_closed_early_ends_the_command_quietly(tmp_path):
    # far more output than a pipe holds, so the command is still writing when the reader goes away
    records = [("clock.tick", encode(sample("clock.tick", i)), float(i)) for i in range(5000)]
    write_log(tmp_path / "events", records, config={}, params={}, sources={})
    proc = rubick("log", "show", str(tmp_path / "events"), "-n", "0", "--json")
    assert proc.stdout.readline().startswith(b"{")
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_log_commands_find_the_events_folder_of_a_data_folder(data_dir, capsys):
    assert main(["log", "show", str(data_dir), "-n", "5"]) == 0
    out, err = capsys.readouterr()
    assert out.count("clock.tick") == 5
    assert "first 5 of 120 rows (-n N for more, -n 0 for all)" in err, "a cut table says so"
    assert main(["log", "stats", str(data_dir)]) == 0
    assert "120" in capsys.readouterr().out


def test_a_folder_with_no_log_is_named(tmp_path, capsys):
    assert main(["log", "show", str(tmp_path)]) == 2
    assert f"no event log in {tmp_path}" in capsys.readouterr().err
    assert main(["log", "tail", str(tmp_path / "nope")]) == 2
    assert "(no such folder)" in capsys.readouterr().err


def test_a_data_folder_without_a_running_up_is_refused_not_replaced(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RUBICK_NATS_URL", raising=False)
    job = REPO / "examples" / "jobs" / "gpt2-guaranteed.yaml"
    assert main(["submit", str(job), "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"no running `rubick up` in {tmp_path}" in err and "--nats-url" in err
    assert main(["status", "--data-dir", str(tmp_path)]) == 2
    assert f"no running `rubick up` in {tmp_path}" in capsys.readouterr().err


def test_a_mistyped_flag_shows_its_own_commands_usage():
    proc = rubick("log", "show", "--lgo", "x", "somewhere")
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 2
    assert err.startswith("usage: rubick log show") and "unrecognized arguments: --lgo" in err, err
    proc = rubick("status", "--nats-ulr", "nats://x")
    err = proc.communicate(timeout=60)[1].decode()
    assert err.startswith("usage: rubick status") and "--nats-ulr" in err, err


def test_the_known_model_types_are_listed(tmp_path, capsys, monkeypatch):
    import dataclasses
    import json

    from controlplane.events import ModelRef, make
    from controlplane.models import builtin_model_types

    from .samples import NEW_SPEC, PAYLOADS

    monkeypatch.delenv("RUBICK_NATS_URL", raising=False)
    assert main(["models", "--json", "--data-dir", str(tmp_path)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["type"] for m in listed] == sorted(builtin_model_types()) and "gpt2" in {m["type"] for m in listed}
    new = dataclasses.replace(PAYLOADS["job.submitted"], job_id="n1", model=ModelRef(type=NEW_SPEC.name, spec=NEW_SPEC))
    write_log(tmp_path / "events", [("job.submitted", encode(make("job.submitted", new, time=1.0, id="s1",
                                                                  source="t")), 1.0)],
              config={}, params={}, sources={})
    assert main(["models", "--log", str(tmp_path / "events")]) == 0
    out = capsys.readouterr().out
    assert f"{NEW_SPEC.name}  (added by a submission with its spec)" in out and "from the event log" in out
