"""Replay: recorded decisions reproduced byte for byte, a changed one caught, bad logs named; what-if."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil

import polars as pl
import pytest

from controlplane.events import decode, encode
from replay.config import RunConfig, load_parts
from replay.run import simulate, trace_inputs
from replay.verify import format_result, verify
from replay.whatif import what_if

from .test_simulate import jobs_of


@pytest.fixture(scope="module")
def recorded(parts, tmp_path_factory):
    d = tmp_path_factory.mktemp("rec")
    cfg = RunConfig(policy="rubick", cluster="4x8", sample_every_s=300.0)
    out = simulate(cfg, trace_inputs(cfg, jobs_of(parts, n=30, start=10), parts), parts, out_dir=d)
    return d, out


def copy_log(recorded, tmp_path):
    d = tmp_path / "events"
    shutil.copytree(recorded[0] / "events", d)
    return d


def test_every_recorded_decision_is_reproduced(recorded):
    d, out = recorded
    result = verify(d / "events")
    assert result.ok, format_result(result, d)
    n = out.summary["plan_decided"]
    assert n > 0 and result.checked["plan.decided"] == n == result.plan_decided_recorded
    assert result.checked.get("model.updated", 0) == out.summary["events"].get("model.updated", 0)
    only = verify(d / "events", only=("policy",))
    pending = out.summary["events"].get("plan.pending", 0)
    assert pending > 0 and result.checked["plan.pending"] == pending  # why jobs waited: replayed too
    assert only.ok and only.checked == {"plan.decided": n, "plan.pending": pending}
    named = verify(d / "events", only="policy")  # one name as a string: that core, not its letters
    assert named.ok and named.checked == only.checked
    with pytest.raises(ValueError, match="no core named polcy"):
        verify(d / "events", only="polcy")


def test_a_changed_decision_is_caught_at_its_event(recorded, tmp_path):
    d = copy_log(recorded, tmp_path)
    [path] = sorted(d.glob("*.parquet"))
    frame = pl.read_parquet(path)
    seqs = frame.filter(pl.col("subject") == "plan.decided")["seq"].to_list()
    target = seqs[len(seqs) // 2]
    idx = target - 1
    event = decode(frame["data"][idx], "plan.decided")
    first = event.payload.decisions[0]
    changed = first.__class__(**{**first.__dict__, "predicted_throughput": first.predicted_throughput + 1.0})
    event = event.__class__(**{**event.__dict__, "payload": event.payload.__class__(
        **{**event.payload.__dict__, "decisions": (changed, *event.payload.decisions[1:])})})
    data = frame["data"].to_list()
    data[idx] = encode(event)
    frame.with_columns(pl.Series("data", data, dtype=pl.Binary)).write_parquet(path)
    result = verify(d)
    assert result.divergence is not None and result.divergence.seq == target
    assert result.divergence.core == "policy"
    assert result.checked["plan.decided"] == seqs.index(target)
    text = format_result(result, d)
    assert f"DIVERGED at event {target}" in text and "recorded:" in text and "replayed:" in text
    assert len(result.divergence.before) == 5 and result.divergence.before[-1][0] == target - 1
    assert "its bytes differ from the run's manifest" in text
    assert "this difference may come from them" in text


def test_a_difference_in_a_log_that_differs_from_its_manifest_is_not_blamed_on_the_cores(recorded, tmp_path, capsys):
    """Exit 1 says the cores decide differently; a log that is not what the run wrote cannot say that:
    exit 2, with the difference shown and the warning. Once the manifest agrees, it is exit 1."""
    from controlplane.cli import main

    d = copy_log(recorded, tmp_path)
    [path] = sorted(d.glob("*.parquet"))
    frame = pl.read_parquet(path)
    idx = frame.filter(pl.col("subject") == "plan.decided")["seq"].to_list()[0] - 1
    event = decode(frame["data"][idx], "plan.decided")
    event = event.__class__(**{**event.__dict__, "payload": event.payload.__class__(
        **{**event.payload.__dict__, "round": event.payload.round + 100})})
    data = frame["data"].to_list()
    data[idx] = encode(event)
    frame.with_columns(pl.Series("data", data, dtype=pl.Binary)).write_parquet(path)
    assert main(["replay", str(d)]) == 2
    text = capsys.readouterr().out
    assert "DIVERGED" in text and "this difference may come from them" in text

    run = json.loads((d / "run.json").read_text())
    run["files"][0]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    run["files"][0]["bytes"] = path.stat().st_size
    (d / "run.json").write_text(json.dumps(run))
    assert main(["replay", str(d)]) == 1
    text = capsys.readouterr().out
    assert "DIVERGED" in text and "problem:" not in text and "may come from them" not in text


def test_a_missing_file_is_named_and_nothing_after_it_is_claimed(recorded, tmp_path):
    d = copy_log(recorded, tmp_path)
    [path] = sorted(d.glob("*.parquet"))
    path.unlink()
    result = verify(d)
    assert not result.ok and result.unchecked_from_seq == 1
    assert any(path.name in p and "missing" in p for p in result.problems)
    assert result.checked.get("plan.decided", 0) == 0


def test_a_corrupt_file_and_a_missing_run_description_are_reported(recorded, tmp_path):
    d = copy_log(recorded, tmp_path)
    [path] = sorted(d.glob("*.parquet"))
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    result = verify(d)
    assert any(path.name in p and "unreadable Parquet" in p for p in result.problems)
    (d / "run.json").unlink()
    result = verify(d)
    assert result.problems == ["run.json: missing, so the cores that made the run cannot be rebuilt; nothing checked",
                               f"{path.name}: its bytes differ from the log's manifest (manifest-{path.name.split('-')[1]}"
                               f".jsonl) (truncated: {size // 2:,} of its {size:,} bytes)"]


def test_what_if_replays_the_recorded_day_under_another_policy(recorded, tmp_path):
    d, out = recorded
    new, problems = what_if(d / "events", tmp_path / "whatif", policy="rubick-n")
    assert problems == []
    s = new.summary
    assert s["config"]["policy"] == "rubick-n" and s["what_if_of"] == str(d / "events")
    assert s["jobs"]["submitted"] == out.summary["jobs"]["submitted"]
    assert [j["job_id"] for j in s["per_job"]] == [j["job_id"] for j in out.summary["per_job"]]
    assert s["plan_decided_sha256"] != out.summary["plan_decided_sha256"]
    assert verify(tmp_path / "whatif" / "events").ok
    same, _ = what_if(d / "events", tmp_path / "same")
    assert same.summary["plan_decided_sha256"] == out.summary["plan_decided_sha256"]
    assert json.loads((tmp_path / "same" / "summary.json").read_text())["jct"] == out.summary["jct"]


def test_a_run_written_again_to_its_folder_replaces_the_old_log(recorded, parts, tmp_path):
    d = tmp_path / "again"
    shutil.copytree(recorded[0], d)
    cfg = RunConfig(policy="rubick", cluster="4x8", sample_every_s=300.0, restart_cost_s=100.0)
    out = simulate(cfg, trace_inputs(cfg, jobs_of(parts, n=30, start=10), parts), parts, out_dir=d)
    assert sorted(p.name for p in (d / "events").glob("*.parquet")) == sorted(p.name for p in out.files)
    result = verify(d / "events")
    assert result.ok and result.checked["plan.decided"] == out.summary["plan_decided"]


def test_runs_recorded_before_batching_holding_and_backoff_are_rebuilt_without_them():
    old = RunConfig(policy="rubick").to_json()
    del old["batch_s"], old["hold_s"], old["hold_backoff_s"]
    cfg = RunConfig.from_json(old)
    assert cfg.batch_s == 0.0 and cfg.hold_s == 0.0 and cfg.hold_backoff_s == 0.0
    assert RunConfig(policy="rubick").hold_backoff_s == 3600.0
    assert RunConfig.from_json(RunConfig(policy="rubick").to_json()) == RunConfig(policy="rubick")


def test_runs_recorded_before_the_refit_backoff_refit_as_often_as_they_did():
    from replay.config import control_cores, load_parts

    old = RunConfig(policy="rubick").to_json()
    del old["refit_backoff"]
    assert RunConfig.from_json(old).refit_backoff == 0 and RunConfig(policy="rubick").refit_backoff == 3
    parts = load_parts()
    for backoff in (0, 3, 6):
        modeler = control_cores(RunConfig(policy="rubick", refit_backoff=backoff), parts)[1]
        assert modeler.name == "modeler" and modeler.refit_backoff == backoff


def test_runs_recorded_before_error_bounds_refit_without_anchors_or_bounds(tmp_path, monkeypatch):
    from replay import config as run_config
    from replay.config import Parts, control_cores, fit_anchors, fit_points_digest

    new = RunConfig(policy="rubick")
    assert new.anchors == fit_points_digest() != "" and new.refit_folds == 5
    old = new.to_json()
    del old["anchors"], old["refit_folds"]
    cfg = RunConfig.from_json(old)
    assert cfg.anchors == "" and cfg.refit_folds == 0
    parts = load_parts()
    assert parts.bounds and all(b["all"] > 0 for b in parts.bounds.values())  # seeded from the fit
    assert parts.params["gpt2"]["error_bound.DP"] == parts.bounds["gpt2"]["DP"]
    unbounded = Parts(parts.models, parts.env, parts.table,
                      {k: {n: x for n, x in v.items() if not n.startswith("error_bound")} for k, v in parts.params.items()})
    assert unbounded.bounds == {} and unbounded.perf_params() == parts.perf_params()
    modeler = next(c for c in control_cores(cfg, unbounded) if c.name == "modeler")
    assert all(st.anchors is None and st.bounds is None for st in modeler.types.values())
    modeler = next(c for c in control_cores(new, parts) if c.name == "modeler")
    assert modeler.types["gpt2"].anchors is not None and modeler.types["gpt2"].bounds == parts.bounds["gpt2"]
    # a run whose fitting points are not this checkout's is refused, with both digests named
    changed = tmp_path / "fit_points.csv"
    changed.write_text(run_config.FIT_POINTS.read_text() + "\n")
    monkeypatch.setattr(run_config, "FIT_POINTS", changed)
    with pytest.raises(ValueError, match=f"kept the fitting points {new.anchors}, but .* is {fit_points_digest()}"):
        fit_anchors(new.anchors, parts.models)


def _change_answers(d, changes):
    """Rewrite recorded answers in place: {subject: (which one of them, payload field, new value from old)}."""
    [path] = sorted(d.glob("*.parquet"))
    frame = pl.read_parquet(path)
    data = frame["data"].to_list()
    targets = {}
    for subject, (which, field, new) in changes.items():
        seq = frame.filter(pl.col("subject") == subject)["seq"].to_list()[which]
        event = decode(data[seq - 1], subject)
        payload = dataclasses.replace(event.payload, **{field: new(getattr(event.payload, field))})
        data[seq - 1] = encode(dataclasses.replace(event, payload=payload))
        targets[subject] = seq
    frame.with_columns(pl.Series("data", data, dtype=pl.Binary)).write_parquet(path)
    return targets


def _as_compared(result):
    d = result.divergence
    return (result.checked, result.events, result.simulated_s, result.span_s, result.problems, result.notes,
            None if d is None else (d.seq, d.core, d.recorded, d.replayed, d.before))


@pytest.mark.parametrize("first", ["model.updated", "plan.decided"])
def test_cores_checked_in_parallel_processes_give_the_result_of_one(recorded, tmp_path, first):
    """The cores are checked in processes of their own (the policy and the admission core here, the modeler in a
    forked child); a difference in each of two cores is planted, and the one earlier in the stream is reported,
    with the same counts and context as a check in one process."""
    d = copy_log(recorded, tmp_path)
    frame = pl.read_parquet(sorted(d.glob("*.parquet"))[0])
    updated = frame.filter(pl.col("subject") == "model.updated")["seq"].to_list()
    decided = frame.filter(pl.col("subject") == "plan.decided")["seq"].to_list()
    assert updated, "the recorded run has no refit to change"
    before, after = [s for s in decided if s < updated[0]], [s for s in decided if s > updated[0]]
    which = decided.index(after[0] if first == "model.updated" else before[-1])
    targets = _change_answers(d, {"model.updated": (0, "rmsle", lambda r: r + 1.0),
                                  "plan.decided": (which, "round", lambda r: r + 100)})
    one = verify(d, jobs=1)
    assert one.divergence.seq == targets[first] and one.divergence.core == {"model.updated": "modeler",
                                                                            "plan.decided": "policy"}[first]
    for jobs in (2, 3):
        assert _as_compared(verify(d, jobs=jobs)) == _as_compared(one)


def test_a_row_only_this_process_decodes_stops_the_childs_check_where_it_stops(recorded, tmp_path):
    """A child decodes only the rows its cores read (the modeler: no clock tick). A tick that is not a valid event
    stops the check there, before a planted difference in the modeler's answers: the child walks past the tick,
    finds that difference, and it is not reported, as a check in one process does not reach it."""
    import msgpack

    d = copy_log(recorded, tmp_path)
    [path] = sorted(d.glob("*.parquet"))
    frame = pl.read_parquet(path)
    updated = frame.filter(pl.col("subject") == "model.updated")["seq"].to_list()
    ticks = frame.filter((pl.col("subject") == "clock.tick") & (pl.col("seq") < updated[0]))["seq"].to_list()
    assert updated and ticks, "the recorded run has no refit after a tick"
    _change_answers(d, {"model.updated": (0, "rmsle", lambda r: r + 1.0)})
    frame = pl.read_parquet(path)
    data = frame["data"].to_list()
    tick = msgpack.unpackb(data[ticks[-1] - 1])
    tick["data"]["planted"] = 1  # an unknown field: the whole event is refused
    data[ticks[-1] - 1] = msgpack.packb(tick)
    frame.with_columns(pl.Series("data", data, dtype=pl.Binary)).write_parquet(path)
    one = verify(d, jobs=1)
    assert one.divergence is None and one.unchecked_from_seq == ticks[-1], format_result(one, d)
    two = verify(d, jobs=2)
    assert two.processes == 2 and _as_compared(two) == _as_compared(one)
    assert verify(d, jobs=2, only=("modeler",)).unchecked_from_seq == ticks[-1]


def test_a_clean_log_checked_in_parallel_processes_checks_every_answer(recorded):
    d, out = recorded
    one, three = verify(d / "events", jobs=1), verify(d / "events", jobs=3)
    assert one.ok and three.ok and _as_compared(three) == _as_compared(one)
    assert three.checked["plan.decided"] == out.summary["plan_decided"]
    assert three.checked["model.updated"] == out.summary["events"]["model.updated"] > 0


def test_a_core_failing_in_a_child_process_is_answered_as_the_live_shell_answers(recorded, monkeypatch):
    """A core that raises is answered with the shell's `*.rejected` (controlplane.service.answers), in replay as
    live: here the recorded run had no such failure, so the check names the first answer that differs."""
    from modeler.service import ModelerCore

    def boom(self, event):
        raise KeyError("planted")

    monkeypatch.setattr(ModelerCore, "handle", boom)
    result = verify(recorded[0] / "events", jobs=2)
    assert result.divergence is not None and result.divergence.core == "modeler"
    assert result.divergence.replayed["data"]["reason"] == "the modeler service failed on it (KeyError: 'planted')"


def test_a_check_failing_in_a_child_process_is_raised_with_where_it_failed(recorded, monkeypatch):
    import replay.verify as verify_module

    real = verify_module.answers

    def boom(core, event, seq):
        if core.name == "modeler":
            raise KeyError("planted")
        return real(core, event, seq)

    monkeypatch.setattr(verify_module, "answers", boom)
    with pytest.raises(KeyError, match="planted") as info:
        verify(recorded[0] / "events", jobs=2)
    assert any("modeler" in note and "boom" in note for note in info.value.__notes__)


def test_a_child_process_that_dies_is_reported_not_waited_for(recorded, monkeypatch):
    from modeler.service import ModelerCore

    monkeypatch.setattr(ModelerCore, "handle", lambda self, event: os._exit(7))
    with pytest.raises(RuntimeError, match=r"check of the modeler core\(s\) stopped without an answer "
                                           r"\(exit code 7\)"):
        verify(recorded[0] / "events", jobs=2)
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        verify(recorded[0] / "events", jobs=0)
