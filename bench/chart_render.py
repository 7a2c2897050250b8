"""How long charts/rubick takes to render, lint and validate with Helm's own code (helm-python-sdk) and the
Kubernetes schemas (kubernetes-validate, strict): the cost of the chart tests and of a CI check.

    .venv/bin/python bench/chart_render.py [--runs 9]

Each run loads the chart and renders it with the value sets of tests/charts (an external NATS: the NATS
subchart is not downloaded here), lints a copy with a stand-in NATS subchart, and validates every rendered
object. Prints the median and the spread of each phase over the runs (the first run, which loads the
libraries and the schemas, is reported apart).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.charts import chart as C  # noqa: E402
from tests.charts.test_chart import VALUE_SETS  # noqa: E402


def one_run(stub: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    with C.load() as chart:
        rendered = {name: C.render(values, chart=chart) for name, values in VALUE_SETS.items()}
    t1 = time.perf_counter()
    report = C.lint(C.EXTERNAL, stub)
    t2 = time.perf_counter()
    failures = [f for objects in rendered.values() for f in C.validate(objects)]
    t3 = time.perf_counter()
    if report["errors"] or failures:
        raise SystemExit(f"the chart does not pass: {report['errors']} {failures}")
    objects = sum(len(o) for o in rendered.values())
    return {"render": t1 - t0, "lint": t2 - t1, "validate": t3 - t2, "total": t3 - t0, "objects": objects}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=9)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stub = C.with_stub(Path(tmp))
        first = one_run(stub)
        runs = [one_run(stub) for _ in range(args.runs)]
    print(f"charts/rubick: {len(VALUE_SETS)} value sets, {first['objects']:.0f} objects rendered per run, "
          f"{args.runs} runs after a first one (Kubernetes {C.KUBE_VERSION} schemas, strict)")
    print(f"{'phase':<10} {'first':>9} {'median':>9} {'min':>9} {'max':>9}")
    for phase in ("render", "lint", "validate", "total"):
        values = [r[phase] for r in runs]
        print(f"{phase:<10} {first[phase] * 1e3:>7.1f}ms {statistics.median(values) * 1e3:>7.1f}ms "
              f"{min(values) * 1e3:>7.1f}ms {max(values) * 1e3:>7.1f}ms")
    per_object = statistics.median(r["validate"] / r["objects"] for r in runs)
    print(f"validation per object: {per_object * 1e3:.2f} ms (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
