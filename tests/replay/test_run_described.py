"""The run description on the bus: a log without run.json is replayed from its `run.described` events."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.events import encode
from replay.config import RUN_FILE, RunConfig, load_parts
from replay.live import describe, description_event, rebuilt_cores, run_from_log
from replay.record import read_run, write_log


@pytest.fixture(scope="module")
def parts():
    return load_parts()


def write(tmp_path, events) -> None:
    write_log(tmp_path, [(e.subject, encode(e), e.time) for e in events], config={"x": 1}, params={}, sources={})
    (tmp_path / RUN_FILE).unlink()


def test_a_log_without_run_json_rebuilds_each_core_from_its_own_description(tmp_path, parts):
    base = RunConfig(policy="rubick", cluster="", quotas={"team-a": 8})
    old_policy = describe("policy", replace(base, quotas={"team-a": 4}), parts)
    events = [description_event(describe("admission", base, parts), 100.0),
              description_event(old_policy, 101.0),
              description_event(describe("policy", replace(base, restart_cost_s=30.0), parts), 102.0)]
    write(tmp_path, events)

    run = read_run(tmp_path)
    assert run["from_log"] and run["kind"] == "live" and sorted(run["services"]) == ["admission", "policy"]
    assert run["sources"] == {"admission": ["admission"], "policy": ["policy"]}
    assert run["config"]["restart_cost_s"] == 30.0 and run["config"]["sim_clock_origin"] == 100.0
    assert [c["config"]["quotas"] for c in run["earlier_configs"]] == [{"team-a": 4}]
    admission, policy = rebuilt_cores(run)
    assert (admission.name, policy.name) == ("admission", "policy")
    assert policy.engine.restart_cost_s == 30.0
    assert sorted(admission.state.known_models) == sorted(parts.models)
    assert {k: v.spec for k, v in policy.models.items()} == {k: v.spec for k, v in parts.models.items()}


def test_no_description_and_no_run_json_is_still_missing(tmp_path, parts):
    write(tmp_path, [])
    assert run_from_log(tmp_path) is None
    with pytest.raises(FileNotFoundError):
        read_run(tmp_path)


def test_replicas_describing_the_same_core_give_one_id(parts):
    cfg = RunConfig(policy="rubick", cluster="")
    a, b = (description_event(describe("policy", cfg, parts), t) for t in (1.0, 2.0))
    assert a.id == b.id and a.source == "service-policy"
    other = description_event(describe("policy", replace(cfg, restart_cost_s=1.0), parts), 1.0)
    assert other.id != a.id


def test_the_modelers_refit_backoff_is_described_and_a_description_recorded_before_it_rebuilds_without_it(
        tmp_path, parts):
    import msgpack

    cfg = RunConfig(policy="rubick", cluster="", refit_backoff=3)
    described = description_event(describe("modeler", cfg, parts), 100.0)
    assert described.payload.refit_backoff == 3
    write(tmp_path / "new", [described])
    (modeler,) = rebuilt_cores(read_run(tmp_path / "new"))
    assert modeler.name == "modeler" and modeler.refit_backoff == 3

    old = msgpack.unpackb(encode(described), raw=False)  # as recorded before descriptions carried it
    del old["data"]["refit_backoff"]
    write_log(tmp_path / "old", [("run.described", msgpack.packb(old, use_bin_type=True), 100.0)], config={"x": 1},
              params={}, sources={})
    (tmp_path / "old" / RUN_FILE).unlink()
    run = read_run(tmp_path / "old")
    assert run["config"]["refit_backoff"] == 0
    (modeler,) = rebuilt_cores(run)
    assert modeler.refit_backoff == 0
