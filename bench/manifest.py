"""What the event log's file manifest costs: writing a file with and without its manifest line, and
checking a folder against its manifest, on this machine's disk.

For each file size (rows of `metrics.iteration`), per run: the time `write_atomic` takes (Parquet,
fsync, manifest line, rename), the part of it that is the manifest line (`file_entry`: sha256 of the
file, plus the appended, fsynced line), and the time `controlplane.eventlog.check` takes for a folder
of such files, per MB. Prints the medians over the runs.

    python bench/manifest.py [--runs 5] [--rows 2000 20000 100000] [--files 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.eventlog import check  # noqa: E402
from controlplane.events import MetricsIteration, Plan, encode, make  # noqa: E402
from controlplane.recorder import manifest  # noqa: E402
from controlplane.recorder.rows import row_of  # noqa: E402
from controlplane.recorder.writer import write_atomic  # noqa: E402


def rows(n: int, start: int) -> list[tuple]:
    out = []
    for i in range(start, start + n):
        e = make("metrics.iteration", MetricsIteration(job_id=f"job-{i % 50}", model_type="gpt2", iteration=i,
                                                       iter_time_s=1.0 + (i % 7) / 10, plan=Plan(dp=2),
                                                       gpus_per_node=(2,), node="node-0"),
                 time=1_700_000_000.0 + i, id=f"ev-{i}", source="bench")
        out.append(row_of(i, "metrics.iteration", encode(e), e.id, e.time))
    return out


def one(n: int, files: int) -> tuple[float, float, float, float]:
    """(write ms per file, manifest-line ms per file, check ms per MB, MB per file) of one run."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        batches = [rows(n, 1 + k * n) for k in range(files)]
        t0 = time.perf_counter()
        paths = [write_atomic(d, "bench", b) for b in batches]
        write_s = (time.perf_counter() - t0) / files
        t0 = time.perf_counter()
        for p in paths:
            manifest.append(d, "other", manifest.file_entry(p, p.name, n, 1, n))
        line_s = (time.perf_counter() - t0) / files
        (d / manifest.manifest_name("other")).unlink()
        mb = sum(p.stat().st_size for p in paths) / 1e6
        t0 = time.perf_counter()
        problems = check(d)
        check_s = time.perf_counter() - t0
        assert problems == [], problems
        return write_s * 1e3, line_s * 1e3, check_s * 1e3 / mb, mb / files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", type=int, nargs="+", default=[2000, 20000, 100000])
    ap.add_argument("--files", type=int, default=3)
    args = ap.parse_args()
    print(f"{'rows/file':>10} {'MB/file':>8} {'write ms':>9} {'manifest ms':>12} {'share':>6} {'check ms/MB':>12}")
    for n in args.rows:
        runs = [one(n, args.files) for _ in range(args.runs)]
        w, line, c, mb = (statistics.median(r[i] for r in runs) for i in range(4))
        print(f"{n:>10,} {mb:>8.2f} {w:>9.1f} {line:>12.2f} {line / w:>6.1%} {c:>12.2f}")
    print(f"(medians of {args.runs} runs; 'manifest ms' is the sha256 and the fsynced line, already inside 'write ms')")


if __name__ == "__main__":
    main()
