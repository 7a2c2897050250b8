"""The Grafana dashboard asks only for what the services export.

Every PromQL query of `charts/rubick/dashboards/rubick.json` (panel targets, rows' nested panels,
template variables) names metrics of `controlplane.metrics.REGISTRY`, with the names Prometheus
sees (a counter `x` as `x_total`, a histogram as `x_bucket` / `x_sum` / `x_count`), filters and
groups only on labels those metrics have (or that the scrape adds), and the scheduler's metrics
each appear on it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from controlplane import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "rubick" / "dashboards" / "rubick.json"
SCRAPE_LABELS = {"namespace", "pod", "instance", "job", "container", "endpoint", "service"}
"""labels Prometheus adds to every series of a ServiceMonitor's target"""
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}
SCHEDULER = ("rubick_jobs_pending", "rubick_jobs_running", "rubick_gpus_total", "rubick_gpus_allocated",
             "rubick_gpus_free", "rubick_quota_gpus", "rubick_quota_used_gpus", "rubick_guaranteed_jobs",
             "rubick_guaranteed_behind", "rubick_reconfigurations", "rubick_restart_cost_seconds",
             "rubick_round_seconds", "rubick_model_refits", "rubick_model_fit_rmsle", "rubick_prediction_error_ratio",
             "rubick_prediction_overshoot_ratio")
METRIC = re.compile(r"\b(rubick_[a-z0-9_]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def exported() -> dict[str, tuple[str, set[str]]]:
    """Series name as Prometheus sees it -> (family, label names), for every metric in the registry."""
    labels = {m._name: set(m._labelnames) for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)}
    out = {}
    for family in metrics.REGISTRY.collect():
        for suffix in SUFFIXES[family.type]:
            out[family.name + suffix] = (family.name, labels.get(family.name, set()) | ({"le"} if suffix == "_bucket"
                                                                                          else set()))
    return out


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every query on the dashboard."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p['id']} {p.get('title')!r} {t.get('refId')}", t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable {v['name']}", q))
            out.append((f"variable {v['name']} definition", v.get("definition", q)))
    return out


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_every_query_names_exported_metrics_and_their_labels(dashboard):
    names = exported()
    found = queries(dashboard)
    assert len(found) >= 30
    for where, q in found:
        used = METRIC.findall(q)
        assert used, f"{where}: no rubick metric in {q!r}"
        assert q.count("(") == q.count(")"), f"{where}: unbalanced parentheses in {q!r}"
        have = set(SCRAPE_LABELS)
        for name, selector in used:
            assert name in names, f"{where}: {name} is not exported ({sorted({f for f, _ in names.values()})})"
            family, labels = names[name]
            have |= labels
            for label in MATCHER.findall(selector or ""):
                assert label in labels | SCRAPE_LABELS, f"{where}: {name} has no label {label!r}"
        for group in GROUPING.findall(q):
            for label in (x.strip() for x in group.split(",") if x.strip()):
                assert label in have, f"{where}: groups by {label!r}, which none of its metrics has"
        for var in re.findall(r"label_values\([^,]+,\s*([a-z_]+)\)", q):
            assert var in have, f"{where}: no metric of it has the label {var!r}"


def test_the_scheduler_metrics_are_on_the_dashboard_and_every_family_is_used(dashboard):
    names = exported()
    used = {names[n][0] for _, q in queries(dashboard) for n, _ in METRIC.findall(q) if n in names}
    assert set(SCHEDULER) <= {f for f, _ in names.values()}
    assert not set(SCHEDULER) - used, sorted(set(SCHEDULER) - used)
    assert used == {f for f, _ in names.values()}, sorted({f for f, _ in names.values()} - used)


def test_a_name_the_registry_does_not_export_is_caught():
    names = exported()
    assert "rubick_round_seconds_bucket" in names and "rubick_round_seconds" not in names
    assert "rubick_reconfigurations_total" in names and "rubick_reconfigurations" not in names
    assert "rubick_jobs_pending" in names and "rubick_jobs_pending_total" not in names
    assert names["rubick_jobs_pending"][1] == {"tenant"}
