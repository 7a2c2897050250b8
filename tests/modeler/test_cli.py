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


def _bert_rows():
    rows = (DATA / "fit_points.csv").read_text().splitlines()
    return rows[0], rows[0].split(","), [r.split(",") for r in rows[1:] if r.startswith("bert,")]


def _fit_file(tmp_path, capsys, header, body):
    points = tmp_path / "p.csv"
    points.write_text("\n".join([header, *(",".join(r) for r in body)]) + "\n")
    return run(capsys, "model", "fit", "--spec", str(MODELS / "bert.yaml"), "--points", str(points),
               "--out", str(tmp_path / "o.json"))


def test_every_bad_row_is_named_at_once(tmp_path, capsys):
    header, cols, body = _bert_rows()
    for i, value in ((1, "0"), (4, "-0.2"), (5, "")):
        body[i][cols.index("iter_time_s")] = value
    code, _, err = _fit_file(tmp_path, capsys, header, body)
    assert code == 2 and "3 bad row(s)" in err
    assert all(f"row {r}: iter_time_s" in err for r in (2, 5, 6)), err
    assert not (tmp_path / "o.json").exists()


def test_a_negative_or_too_long_breakdown_part_is_refused(tmp_path, capsys):
    header, cols, body = _bert_rows()
    body[0][cols.index("forward_ms")] = "-5"
    body[3][cols.index("optimize_ms")] = str(float(body[3][cols.index("iter_time_s")]) * 2000)
    code, _, err = _fit_file(tmp_path, capsys, header, body)
    assert code == 2 and "row 1: breakdown part fwd_s must be >= 0 s" in err
    assert "row 4: breakdown part opt_s is longer than the whole iteration" in err


def test_duplicate_configurations_with_conflicting_times_name_both_rows(tmp_path, capsys):
    header, cols, body = _bert_rows()
    it = cols.index("iter_time_s")
    again = list(body[1])
    again[it] = str(float(again[it]) * 1.5)  # the same configuration measured 50% slower
    code, _, err = _fit_file(tmp_path, capsys, header, [*body, again])
    assert code == 2 and f"rows 2 and {len(body) + 1} are the same configuration with conflicting times" in err
    # a repeat that agrees (within 10%) is a second measurement, and kept
    again[it] = str(float(body[1][it]) * 1.03)
    code, out, err = _fit_file(tmp_path, capsys, header, [*body, again])
    assert code == 0 and f"fitted on {len(body) + 1} points" in out, err


def test_fit_writes_an_error_bound_and_predict_gives_each_row_an_interval(tmp_path, capsys):
    params = tmp_path / "t5.json"
    code, out, err = run(capsys, "model", "fit", "--spec", str(MODELS / "t5.yaml"), "--points", POINTS,
                         "--out", str(params))
    assert code == 0 and "error bound: out-of-fold RMS log error" in out, err
    unc = json.loads(params.read_text())["uncertainty"]
    assert unc["folds"] == 10 and unc["sigma_cv"] > 0 and len(unc["samples"]) == 16
    assert set(unc["by_family"]) == {"DP", "ZeRO-Offload", "3D"}  # t5's fitting points' families
    pred = tmp_path / "pred.csv"
    table = str(DATA / "throughput_table.csv")
    code, out, err = run(capsys, "model", "predict", "--spec", str(MODELS / "t5.yaml"), "--params", str(params),
                         "--configs", table, "--out", str(pred))
    assert code == 0 and "no error bounds" not in out, err
    mine = [r for r in csv.DictReader(pred.open()) if r["model"] == "t5"]
    lo, mid, hi = ([float(r[c]) for r in mine] for c in ("pred_low_s", "pred_iter_time_s", "pred_high_s"))
    assert all(a < b < c for a, b, c in zip(lo, mid, hi))
    pct = [float(r["pred_error_pct"]) for r in mine]
    assert all(abs(p - (h / m - 1) * 100) < 0.01 for p, h, m in zip(pct, hi, mid))
    # a ZeRO-DP row (no t5 fitting point of that family) gets the type's overall bound, 3D rows the 3D one
    z = unc["z"]
    zero = next(r for r in mine if r["plan_family"] == "zero-dp")
    assert abs(float(zero["pred_error_pct"]) / 100 - (2.718281828 ** (z * unc["sigma_cv"]) - 1)) < 0.01
    # parameters written before bounds existed: predictions without them, and a word saying so
    doc = json.loads(params.read_text())
    del doc["uncertainty"]
    params.write_text(json.dumps(doc))
    code, out, err = run(capsys, "model", "predict", "--spec", str(MODELS / "t5.yaml"), "--params", str(params),
                         "--configs", table, "--out", str(pred))
    assert code == 0 and "no error bounds" in out
    assert all(r["pred_low_s"] == "" for r in csv.DictReader(pred.open()))
    doc["uncertainty"] = {"sigma_cv": -1, "folds": 3}
    params.write_text(json.dumps(doc))
    code, _, err = run(capsys, "model", "predict", "--spec", str(MODELS / "t5.yaml"), "--params", str(params),
                       "--configs", table, "--out", str(pred))
    assert code == 2 and "sigma_cv must be >= 0" in err


def test_too_few_points_is_exit_2(tmp_path, capsys):
    points = tmp_path / "p.csv"
    lines = (DATA / "fit_points.csv").read_text().splitlines()
    points.write_text("\n".join([lines[0]] + [r for r in lines[1:] if r.startswith("vit,") and ",DP," in r]) + "\n")
    points_sans_breakdown = tmp_path / "q.csv"
    import polars as pl

    pl.read_csv(points).drop("forward_ms", "overlap_sync_ms", "optimize_ms").write_csv(points_sans_breakdown)
    code, _, err = run(capsys, "model", "fit", "--spec", str(MODELS / "vit.yaml"), "--points",
                       str(points_sans_breakdown), "--out", str(tmp_path / "o.json"))
    assert code == 2 and "vit: 3 measured point(s) (rows 1, 2 and 3)" in err and "at least 7" in err


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
    assert "rows" in out and "inside their bound" in out
