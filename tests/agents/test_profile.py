"""`rubick profile`: sampled configurations measured for real on the CPU, published as
`metrics.iteration`, written as a table that `rubick model fit` fits."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from agents.profile import MIN_CONFIGS, MIN_OFFLOAD, sample_plans
from controlplane.events import decode

from .helpers import REPO

SPEC = REPO / "examples" / "trainer" / "tiny-gpt.yaml"


@pytest.mark.parametrize("devices", [1, 2, 4, 8])
def test_enough_configurations_and_offload_ones(devices):
    plans = sample_plans(devices, 64)
    assert len(plans) >= MIN_CONFIGS and sum(p.offload for p in plans) >= MIN_OFFLOAD
    assert len(set(plans)) == len(plans) and all(p.dp in (1, devices) for p in plans)


def test_3d_configurations_where_the_architecture_allows_them():
    plans = sample_plans(4, 8, heads=4, layers=2)
    three_d = {p.code() for p in plans if p.tp > 1 or p.pp > 1}
    assert three_d == {"dp2-tp2-pp1-z0-ga1", "dp1-tp4-pp1-z0-ga1", "dp2-tp1-pp2-z0-ga1-mb4",
                       "dp1-tp2-pp2-z0-ga1-mb8"}, "PP 4 does not divide 2 layers; PP with one sample per micro-batch"
    assert all(p.gpus == 4 for p in plans if p.tp > 1 or p.pp > 1)
    assert not [p for p in sample_plans(4, 8, heads=3, layers=3) if p.tp > 1 or p.pp > 1]


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_profile_publishes_and_the_modeler_fits_its_table(js_bus, nats_server, tmp_path):
    out, out_spec = tmp_path / "points.csv", tmp_path / "spec.yaml"
    cli = [sys.executable, "-m", "controlplane.cli"]
    done = subprocess.run([*cli, "profile", "--spec", str(SPEC), "--cpu-devices", "2", "--nats-url", nats_server.url,
                           "--warmup", "1", "--iterations", "3", "--out", str(out), "--out-spec", str(out_spec)],
                          cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert len(rows) >= MIN_CONFIGS and sum(r["offload"] == "1" for r in rows) >= MIN_OFFLOAD
    assert all(float(r["iter_time_s"]) > 0 for r in rows)
    assert all(float(r["forward_ms"]) > 0 for r in rows if r["pp"] == "1")  # a pipeline's forward is not apart
    assert {(r["tp"], r["pp"]) for r in rows} >= {("2", "1"), ("1", "2")}, "TP and PP measured too"

    assert "could not be published" not in done.stderr
    events = [decode(d.data, d.subject) async for d in js_bus.read(("metrics.iteration", "metrics.iteration.>"))]
    by_plan = {}
    for e in events:
        by_plan.setdefault(e.payload.plan.code(), []).append(e.payload)
    assert sorted(by_plan) == sorted(r["plan_label"] for r in rows)
    assert all(len(v) == 3 and all(x.model_type == "tiny-gpt" for x in v) for v in by_plan.values())

    fit = subprocess.run([*cli, "model", "fit", "--spec", str(out_spec), "--points", str(out), "--out",
                          str(tmp_path / "params.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert fit.returncode == 0, fit.stderr
    assert f"fitted on {len(rows)} points" in fit.stdout
