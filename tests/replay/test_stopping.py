"""A time limit (SIGTERM) or Ctrl-C (SIGINT) that comes while `rubick simulate` is still getting ready (reading the
trace, fitting the models) still gets the run written, with nothing simulated, and the exit code of the signal; a
second signal then ends the process at once. Real signals, sent by the process to itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from replay.verify import verify

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "data" / "rubick-artifact" / "workload-base.csv"


def simulate_signalled(out: Path, sig: signal.Signals, module: str, name: str) -> subprocess.CompletedProcess:
    """`rubick simulate` of the Base trace on 8x8 in a process of its own, which sends itself `sig` as it calls
    `module.name` (a signal nothing catches ends that process, not the tests'); it prints whether the signal
    handlers are those it had before the command once the command is over."""
    script = ("import os, signal, sys\n"
              f"import {module} as where\n"
              "from controlplane.cli import main\n"
              f"real = where.{name}\n"
              "def signalled(*args, **kwargs):\n"
              f"    os.kill(os.getpid(), {int(sig)})\n"
              "    return real(*args, **kwargs)\n"
              f"where.{name} = signalled\n"
              "before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}\n"
              f"code = main(['simulate', '--trace', {str(TRACE)!r}, '--policy', 'rubick', '--cluster', '8x8', "
              f"'--no-progress', '--out', {str(out)!r}])\n"
              "print('handlers as before:', {s: signal.getsignal(s) for s in before} == before)\n"
              "sys.exit(code)\n")
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_trace_is_read_still_writes_the_run(tmp_path, sig):
    out = tmp_path / "run"
    proc = simulate_signalled(out, sig, "replay.importers", "read_trace")
    assert proc.returncode == 128 + sig, proc.stdout + proc.stderr
    assert f"stopped by {sig.name}: {out} holds what was simulated" in proc.stderr
    assert "handlers as before: True" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == f"stopped early ({sig.name}) at 0 s of simulated time"
    assert summary["jobs"]["completed"] == 0
    assert verify(out / "events").ok


def test_a_signal_while_the_run_is_written_ends_the_command_with_the_run_whole(tmp_path):
    out = tmp_path / "run"
    proc = simulate_signalled(out, signal.SIGTERM, "replay.run", "write_log")
    assert proc.returncode == 128 + signal.SIGTERM, proc.stdout + proc.stderr
    assert f"stopped by SIGTERM after {out} was written" in proc.stderr
    assert "handlers as before: True" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "all jobs finished"
    assert summary["jobs"]["completed"] == summary["jobs"]["submitted"] > 0
    assert verify(out / "events").ok


def test_a_second_signal_while_getting_ready_ends_the_process():
    script = ("import os, signal, time\n"
              "from replay.stopping import before, _asked\n"
              "with before():\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(0.2)\n"
              "    print('kept', _asked, flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(10)\n"
              "    print('still here', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGTERM, proc.stdout + proc.stderr
    assert proc.stdout == f"kept [{int(signal.SIGTERM)}]\n"
