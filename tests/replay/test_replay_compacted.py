"""A recorded run whose log was written in many small files and then compacted still replays."""

from __future__ import annotations

import json

from controlplane.cli import main
from controlplane.eventlog import check, scan
from replay.config import RunConfig
from replay.record import write_log
from replay.run import simulate, trace_inputs
from replay.verify import format_result, verify

from .test_simulate import jobs_of


def test_a_compacted_run_is_reproduced(parts, tmp_path, capsys):
    cfg = RunConfig(policy="rubick", cluster="2x8", sample_every_s=600.0)
    out = simulate(cfg, trace_inputs(cfg, jobs_of(parts, n=8, start=3), parts), parts, out_dir=tmp_path / "run")
    log_dir = tmp_path / "run" / "events"
    run = json.loads((log_dir / "run.json").read_text())
    frame = scan(log_dir).frame.sort("seq")
    records = [(s, d, t.timestamp()) for s, d, t in frame.select("subject", "data", "stored").iter_rows()]
    extra = {k: v for k, v in run.items() if k not in ("format", "config", "params", "sources", "stream", "files")}
    write_log(log_dir, records, config=run["config"], params=run["params"], sources=run["sources"], roll_rows=7,
              extra=extra)  # the same run in files of 7 rows, as a recorder on a loaded machine leaves it
    files = len(list(log_dir.glob("events-*.parquet")))
    assert files > 5 and verify(log_dir).ok

    assert main(["log", "compact", str(log_dir), "--target-rows", "1000"]) == 0
    assert f"{files} files -> " in capsys.readouterr().out and len(list(log_dir.glob("events-*.parquet"))) < files / 5
    assert check(log_dir) == [] and scan(log_dir).frame.sort("seq")["data"].to_list() == [r[1] for r in records]
    result = verify(log_dir)
    assert result.ok, format_result(result, tmp_path / "run")
    assert result.checked["plan.decided"] == out.summary["plan_decided"] > 0
