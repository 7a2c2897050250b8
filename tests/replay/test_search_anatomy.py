"""`bench/search_anatomy.py`: its wrappers time and count a real simulation of the Base trace without changing a
decision, count every round the policy ran and every attempt it made, and leave the classes as they were."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "data" / "rubick-artifact" / "workload-base.csv"


def _bench():
    spec = importlib.util.spec_from_file_location("search_anatomy", REPO / "bench" / "search_anatomy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_anatomy_changes_no_decision_and_counts_every_round_and_attempt(tmp_path):
    from policy.engine import RubickEngine
    from policy.engine_search import _Search
    from policy.service import PolicyCore

    bench = _bench()
    own = PolicyCore.__dict__
    before = (own["_handle"], own["run_round"], "_schedule_job" in RubickEngine.__dict__)
    calls = {"attempts": 0}
    schedule = _Search._schedule_job

    def counted(self, *args, **kwargs):  # under the bench's own wrapper: every attempt it timed went through here
        calls["attempts"] += 1
        return schedule(self, *args, **kwargs)

    _Search._schedule_job = counted
    try:
        anatomy, summary = bench.run(str(TRACE), tmp_path / "timed", scale=1, cluster="8x8")
    finally:
        _Search._schedule_job = schedule
    assert (own["_handle"], own["run_round"], "_schedule_job" in RubickEngine.__dict__) == before

    plain = tmp_path / "plain"
    subprocess.run([sys.executable, "-m", "controlplane.cli", "simulate", "--trace", str(TRACE), "--cluster", "8x8",
                    "--policy", "rubick", "--out", str(plain), "--no-progress"], cwd=REPO, check=True,
                   capture_output=True)
    assert summary["plan_decided_sha256"] == json.loads((plain / "summary.json").read_text())["plan_decided_sha256"]

    assert sum(anatomy.attempts_n.values()) == calls["attempts"] > 0
    decided = [k for k in anatomy.rounds_n if k[3] == "decided"]
    assert sum(anatomy.rounds_n[k] for k in decided) == summary_rounds(tmp_path / "timed")
    ends = {k[3] for k in anatomy.attempts_n}
    assert "kept" in ends and "held" in ends
    assert all(e in ("kept", "held") or e.startswith(("failed: ", "ok: ")) for e in ends)
    text = anatomy.report(5)
    assert "rounds: " in text and "attempts: " in text and text.count("\n") == 2 + 5 + 2 + 5 - 1


def summary_rounds(run: Path) -> int:
    """The `plan.decided` events of a run's log."""
    from controlplane.eventlog import scan

    frame = scan(run / "events", ["subject"]).frame
    return int(frame.filter(frame["subject"].str.starts_with("plan.decided")).height)
