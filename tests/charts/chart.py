"""Render, lint and validate charts/rubick with Helm's own Go code (helm-python-sdk, no helm binary) and the
Kubernetes OpenAPI schemas (kubernetes-validate, strict). Shared by the tests and bench/chart_render.py.

The NATS chart (a dependency) cannot be downloaded here, so charts/rubick/charts/ is empty:

- rendering does not need it (Helm renders the chart without an absent subchart), so the value sets render
  with `nats.enabled=false` and `nats.url` (an external NATS), and the defaults render too, without the
  NATS objects;
- `helm lint` reports the absent dependency as a warning, and the install path (like `helm install`) refuses
  the chart until `helm dependency build` has run, even with `nats.enabled=false`; `with_stub` makes a copy
  with an empty stand-in `nats` subchart, which lints and installs (dry run) without it.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "rubick"
RELEASE = "rubick"
NAMESPACE = "rubick"
KUBE_VERSION = "1.33.0"
"""The Kubernetes version the objects are validated against (kubernetes-validate's strict schemas)."""

NO_SCHEMA = {("monitoring.coreos.com/v1", "ServiceMonitor")}
"""Custom resources: kubernetes-validate has no schema for them (their fields are checked by the tests)."""

EXTERNAL = {"nats": {"enabled": False, "url": "nats://nats.messaging.svc:4222"}}
"""The value set every test starts from: an existing NATS (the NATS subchart is not downloaded here)."""


def merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load() -> helm.Chart:
    return helm.Chart.load(CHART)


def render(values: dict | None = None, *, chart: helm.Chart | None = None, release: str = RELEASE,
           namespace: str = NAMESPACE) -> list[dict]:
    """Every object the chart renders with `values` (as `helm template`), in template order."""
    own = chart is None
    chart = chart or load()
    try:
        manifests = chart.render(values or {}, name=release, namespace=namespace, is_install=True)
    finally:
        if own:
            chart.close()
    objects = []
    for path in sorted(manifests):
        if path.endswith("NOTES.txt"):
            continue
        objects += [d for d in yaml.safe_load_all(manifests[path]) if d]
    return objects


def install_dry_run(values: dict, chart_dir: Path, *, release: str = RELEASE, namespace: str = NAMESPACE) -> str:
    """`helm install --dry-run=client` of the chart at `chart_dir` (a `with_stub` copy: like the helm CLI, the
    install path refuses a chart whose declared dependency is absent, whatever its condition), no cluster.
    Returns the manifest."""
    config = helm.Config(namespace=namespace, storage_driver="memory")
    try:
        return config.install(str(chart_dir), release, values, namespace=namespace, dry_run="client")["manifest"]
    finally:
        config.close()


def notes(values: dict | None = None) -> str:
    with load() as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(v for k, v in manifests.items() if k.endswith("NOTES.txt"))


def validate(objects: list[dict], version: str = KUBE_VERSION) -> list[str]:
    """Strict schema validation of every object; returns the failures (empty when all pass)."""
    failures = []
    for obj in objects:
        if (obj.get("apiVersion"), obj.get("kind")) in NO_SCHEMA:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: no schema: {exc.message}")
    return failures


def lint(values: dict | None = None, path: Path = CHART) -> dict[str, Any]:
    return helm.lint(path, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")


def with_stub(workdir: Path) -> Path:
    """A copy of the chart in `workdir` whose `nats` dependency is an empty stand-in subchart (what
    `helm dependency build` would put in charts/, minus the NATS objects)."""
    copy_dir = workdir / "rubick"
    if not copy_dir.exists():
        shutil.copytree(CHART, copy_dir, ignore=shutil.ignore_patterns("charts"))
        stub = copy_dir / "charts" / "nats"
        stub.mkdir(parents=True)
        (stub / "Chart.yaml").write_text("apiVersion: v2\nname: nats\nversion: 1.3.0\ndescription: stand-in\n")
    return copy_dir


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    """(kind/name, pod spec) of everything that runs pods."""
    return [(f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
            for o in objects if o["kind"] in ("Deployment", "DaemonSet", "Job", "StatefulSet")]
