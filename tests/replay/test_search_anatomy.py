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
    calls = {"attempts": 0, "taken back": 0}
    schedule, run_round = _Search._schedule_job, PolicyCore.run_round
    placed = []

    def counted(self, job, jr=None, only=None):  # under the bench's own wrapper: every attempt it timed goes here
        calls["attempts"] += 1
        kept, waiting = self._kept, not (job.inp.running and job.g >= max(1, job.min_g))
        ok = schedule(self, job, jr, only)
        if self._kept != kept and waiting:
            placed.append(job)
        return ok

    def rounded(self, event):  # under the bench's wrapper of rounds: the placed jobs left with no GPU at the end
        out = run_round(self, event)
        calls["taken back"] += sum(1 for job in placed if job.g == 0)
        placed.clear()
        return out

    _Search._schedule_job, PolicyCore.run_round = counted, rounded
    try:
        anatomy, summary = bench.run(str(TRACE), tmp_path / "timed", scale=1, cluster="8x8")
    finally:
        _Search._schedule_job = schedule
        PolicyCore.run_round = run_round
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
    # the Base trace on 8x8 places a waiting job that a later attempt of the same round takes every GPU from
    assert "kept" in ends and "held" in ends and "kept, taken back" in ends
    assert all(e in ("kept", "held", "kept, taken back") or e.startswith(("failed: ", "ok: ")) for e in ends)
    assert all(k[1] == "waiting" for k in anatomy.attempts_n if k[3] == "kept, taken back")
    assert sum(n for k, n in anatomy.attempts_n.items() if k[3] == "kept, taken back") == calls["taken back"]
    text = anatomy.report(5)
    assert "rounds: " in text and "attempts: " in text and text.count("\n") == 2 + 5 + 2 + 5 - 1


def summary_rounds(run: Path) -> int:
    """The `plan.decided` events of a run's log."""
    from controlplane.eventlog import scan

    frame = scan(run / "events", ["subject"]).frame
    return int(frame.filter(frame["subject"].str.starts_with("plan.decided")).height)
