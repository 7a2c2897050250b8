"""Progress on stderr for `simulate`, `replay`, `report` and `model validate`: shown when forced on
or on a terminal, absent otherwise, and never a change to what the commands compute or print."""

from __future__ import annotations

import io
import json
import sys

import pytest

from controlplane.cli import main
from replay import progress as progress_mod
from replay.progress import ReplayProgress, SimProgress, StepProgress, clock, eta

from .conftest import ROOT, trace_slice


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def every_call(monkeypatch):
    """Draw on every callback (no wall-time throttling)."""
    monkeypatch.setattr(progress_mod, "DRAW_EVERY_S", 0.0)
    monkeypatch.setattr(progress_mod, "LINE_EVERY_S", 0.0)


def test_lines_name_simulated_time_jobs_rate_and_eta(every_call):
    out = io.StringIO()
    p = SimProgress("rubick on 8x8", 10, stream=out, live=False)
    p(3600.0, 500, 4, 6)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("rubick on 8x8: simulated 1.0 h, 4/10 jobs done, ETA ")
    assert "events/s" in lines[0] and "elapsed" in lines[0] and "500 events" in lines[0]
    assert lines[-1].endswith("(finished)")
    assert eta(10.0, 4, 10) == pytest.approx(15.0) and eta(1.0, 0, 10) == float("inf") and eta(1.0, 0, 0) == float("inf")
    assert clock(75) == "1:15" and clock(3725) == "1:02:05" and clock(float("inf")) == "?"


def test_live_bar_on_a_terminal(every_call):
    tty = FakeTTY()
    assert progress_mod.enabled(None, tty) and not progress_mod.enabled(None, io.StringIO())
    assert progress_mod.enabled(True, io.StringIO()) and not progress_mod.enabled(False, tty)
    p = SimProgress("antman on 8x8", 10, stream=tty)  # live: stderr is a terminal
    p(7200.0, 900, 5, 10)
    p.close()
    text = tty.getvalue()
    assert "\x1b[" in text  # drawn as a live display
    assert "antman on 8x8" in text and "simulated 2.0 h, 5/10 jobs done, ETA" in text
    r = ReplayProgress("replay check", stream=tty)
    r(512, 1024, 3600.0)
    r.close()
    assert "512/1,024 events fed, ETA" in tty.getvalue()
    s = StepProgress("report", 3, stream=tty)
    s.step("drawing x.png")
    s.advance()
    s.close()
    assert "1/3, ETA" in tty.getvalue() and "drawing x.png" in tty.getvalue()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return trace_slice(tmp_path_factory.mktemp("trace"), "workload-mt.csv", rows=25, start=20)


def _simulate(trace, out, *flags):
    return main(["simulate", "--trace", str(trace), "--cluster", "8x8", "--policy", "rubick", "--out", str(out),
                 *flags])


def test_simulate_progress_is_display_only(tmp_path, trace, capsys, monkeypatch, every_call):
    assert _simulate(trace, tmp_path / "off") == 0
    off = capsys.readouterr()
    assert off.err == ""  # stderr is no terminal here: no progress unless asked for
    assert _simulate(trace, tmp_path / "on", "--progress") == 0
    on = capsys.readouterr()
    assert "rubick on 8x8: simulated " in on.err and "25/25 jobs done" in on.err and "ETA" in on.err
    assert "events/s" in on.err and on.err.rstrip().endswith("(finished)")
    # stdout says the same (but for wall timings), and the run is the same run, byte for byte
    assert on.out.splitlines()[0].split(": ", 1)[1] == off.out.splitlines()[0].split(": ", 1)[1]
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("off", "on"))
    assert a == b
    for f in sorted((tmp_path / "off" / "events").iterdir()):
        if f.suffix == ".parquet":
            assert f.read_bytes() == (tmp_path / "on" / "events" / f.name).read_bytes(), f.name

    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    assert _simulate(trace, tmp_path / "tty") == 0  # on a terminal: shown without the flag
    assert "jobs done" in tty.getvalue() and "ETA" in tty.getvalue()
    tty.seek(0)
    tty.truncate()
    assert _simulate(trace, tmp_path / "quiet", "--no-progress") == 0
    assert tty.getvalue() == ""


def test_replay_report_and_validate_progress(tmp_path, trace, capsys, every_call):
    run = tmp_path / "run"
    assert _simulate(trace, run) == 0
    capsys.readouterr()
    assert main(["replay", str(run), "--jobs", "1", "--progress"]) == 0
    got = capsys.readouterr()
    assert "OK: every recorded decision" in got.out
    assert "replay check of" in got.err and "events fed" in got.err and "ETA" in got.err
    assert main(["replay", str(run), "--jobs", "1"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["replay", str(run), "--policy", "antman", "--out", str(tmp_path / "wi"), "--progress"]) == 0
    err = capsys.readouterr().err
    assert "what-if antman: simulated" in err and "25/25 jobs done" in err
    assert main(["report", str(run), "--out", str(tmp_path / "rep"), "--progress"]) == 0
    got = capsys.readouterr()
    assert "report of 1 run(s): " in got.err and "(finished)" in got.err and "wrote " in got.out
    assert "report of" not in got.out
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert capsys.readouterr().err == ""
    data = ROOT / "data" / "rubick-artifact"
    assert main(["model", "validate", "--data", str(data), "--progress"]) == 0
    got = capsys.readouterr()
    assert "model validate: 7/7, ETA 0:00" in got.err and "fitted on" in got.out
    assert main(["model", "validate", "--data", str(data)]) == 0
    assert capsys.readouterr().err == ""
