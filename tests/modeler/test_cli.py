from __future__ import annotations

import csv
import json

import pytest

from controlplane.cli import main
from tests.modeler.conftest import DATA, ENV_FILE, MODELS

POINTS = str(DATA / "fit_points.csv")


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fit_then_predict(tmp_path, capsys):
    params = tmp_path / "gpt2.json"
    code, out, err = run(capsys, "model", "fit", "--spec", str(MODELS / "gpt2.yaml"), "--points", POINTS,
                         "--env", str(ENV_FILE), "--out", str(params))
    assert code == 0, err
    doc = json.loads(params.read_text())
    assert doc["model"] == "gpt2" and set(doc["params"]) == {"k_bwd", "k_sync", "k_opt", "k_opt_off", "k_off",
                                                              "k_swap", "k_const", "k_3d", "k_tp", "k_pp"}
    assert "RMSLE" in out
    pred = tmp_path / "pred.csv"
    code, out, err = run(capsys, "model", "predict", "--spec", str(MODELS / "gpt2.yaml"), "--params", str(params),
                         "--configs", POINTS, "--out", str(pred))
    assert code == 0, err
    rows = list(csv.DictReader(pred.open()))
    mine = [r for r in rows if r["model"] == "gpt2"]
    assert len(rows) > len(mine) == 7
    assert all(float(r["pred_iter_time_s"]) > 0 and r["feasible"] in ("0", "1") for r in mine)
    assert all(r["pred_iter_time_s"] == "" for r in rows if r["model"] != "gpt2")
    assert "source" in rows[0]  # extra columns kept


def test_fit_without_offload_points_then_predict_offload_is_refused(tmp_path, capsys):
    params = tmp_path / "llama30.json"
    code, out, _ = run(capsys, "model", "fit", "--spec", str(MODELS / "llama30.yaml"), "--points", POINTS,
                       "--out", str(params))
    assert code == 0 and "offload parameters not fitted" in out
    configs = tmp_path / "c.csv"
    configs.write_text("model,dp,tp,pp,zero_stage,offload,gc,ga_steps,gpus_per_node,cpu_threads,global_batch_size\n"
                       "llama30,4,4,3,0,0,0,,6;6;6;6;6;6;6;6,,4\n"
                       "llama30,4,1,1,2,1,1,,4,,4\n")
    code, _, err = run(capsys, "model", "predict", "--spec", str(MODELS / "llama30.yaml"), "--params", str(params),
                       "--configs", str(configs), "--out", str(tmp_path / "o.csv"))
    assert code == 2 and "row 2: ZeRO-Offload configuration" in err


@pytest.mark.parametrize("line, words", [
    ("gpt2,3,1,1,0,0,0,,4,,16", "row 1: dp*tp*pp = 3*1*1 = 3 but the placement 4 has 4 GPUs"),
    ("gpt2,1,8,1,0,0,0,,4;4,,16", "row 1: tp=8 does not fit inside the nodes"),
    ("gpt2,4,1,1,7,0,0,,4,,16", "row 1: zero_stage must be 0, 1, 2 or 3"),
])
def test_impossible_configurations_name_the_row(tmp_path, capsys, line, words):
    params = tmp_path / "p.json"
    params.write_text(json.dumps({"model": "gpt2", "params": {"k_bwd": 2, "k_sync": 2, "k_opt": 0.1,
                                                              "k_opt_off": 10, "k_off": 2, "k_swap": 2,
                                                              "k_const": 0.01}}))
    configs = tmp_path / "c.csv"
    configs.write_text("model,dp,tp,pp,zero_stage,offload,gc,ga_steps,gpus_per_node,cpu_threads,global_batch_size\n"
                       + line + "\n")
    code, _, err = run(capsys, "model", "predict", "--spec", str(MODELS / "gpt2.yaml"), "--params", str(params),
                       "--configs", str(configs), "--out", str(tmp_path / "o.csv"))
    assert code == 2 and words in err and "Traceback" not in err


def test_bad_measurements_name_the_row(tmp_path, capsys):
    rows = (DATA / "fit_points.csv").read_text().splitlines()
    header, body = rows[0], [r for r in rows[1:] if r.startswith("bert,")]
    cols = header.split(",")
    bad = body[2].split(",")
    bad[cols.index("iter_time_s")] = "nan"
    points = tmp_path / "p.csv"
    points.write_text("\n".join([header, *body[:2], ",".join(bad), *body[3:]]) + "\n")
    code, _, err = run(capsys, "model", "fit", "--spec", str(MODELS / "bert.yaml"), "--points", str(points),
                       "--out", str(tmp_path / "o.json"))
    assert code == 2 and "row 3: iter_time_s must be a finite time > 0 s" in err


def test_too_few_points_is_exit_2(tmp_path, capsys):
    points = tmp_path / "p.csv"
    lines = (DATA / "fit_points.csv").read_text().splitlines()
    points.write_text("\n".join([lines[0]] + [r for r in lines[1:] if r.startswith("vit,") and ",DP," in r]) + "\n")
    points_sans_breakdown = tmp_path / "q.csv"
    import polars as pl

    pl.read_csv(points).drop("forward_ms", "overlap_sync_ms", "optimize_ms").write_csv(points_sans_breakdown)
    code, _, err = run(capsys, "model", "fit", "--spec", str(MODELS / "vit.yaml"), "--points",
                       str(points_sans_breakdown), "--out", str(tmp_path / "o.json"))
    assert code == 2 and "vit: 3 measured point(s)" in err and "at least 7" in err


def test_missing_files_are_exit_2(tmp_path, capsys):
    code, _, err = run(capsys, "model", "fit", "--spec", str(tmp_path / "none.yaml"), "--points", POINTS,
                       "--out", str(tmp_path / "o.json"))
    assert code == 2 and "cannot read spec file" in err
    code, _, err = run(capsys, "model", "validate", "--data", str(tmp_path))
    assert code == 2 and "no fit_points.csv" in err


def test_validate_prints_the_table(capsys):
    code, out, _ = run(capsys, "model", "validate", "--data", str(DATA))
    assert code == 0
    assert "paper avg" in out and "llama30" in out and "ZeRO-Offload" in out
