"""What compaction of the event log costs and gains: merging many small files (`rubick log compact`),
and reading the log (`controlplane.eventlog.scan`, the reader of `rubick log`, `rubick replay` and
`rubick status --log`) before and after, on this machine's disk.

For each run: a log of `--files` files of `--rows` rows of `metrics.iteration` written by the
recorder's writer, merged into files of at most `--target-rows` rows; prints the medians over the runs.

    python bench/compact.py [--runs 5] [--files 200] [--rows 100] [--target-rows 200000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.eventlog import check, events, scan  # noqa: E402
from controlplane.recorder import compact  # noqa: E402
from controlplane.recorder.writer import write_atomic  # noqa: E402

from manifest import rows  # noqa: E402  (bench/manifest.py: rows of metrics.iteration)


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def one(files: int, n: int, target: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for k in range(files):
            write_atomic(d, "bench", rows(n, 1 + k * n))
        out = {}
        out["scan_before"], before = timed(lambda: scan(d).frame.height)
        out["decode_before"], _ = timed(lambda: len(events(d).events))
        out["compact"], merges = timed(lambda: compact.compact(d, "bench", target))
        out["files_after"] = len(list(d.glob("events-*.parquet")))
        out["scan_after"], after = timed(lambda: scan(d).frame.height)
        out["decode_after"], _ = timed(lambda: len(events(d).events))
        assert before == after == files * n and check(d) == [] and merges
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--target-rows", type=int, default=200_000)
    args = ap.parse_args()
    runs = [one(args.files, args.rows, args.target_rows) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"{args.files} files of {args.rows} rows -> {med['files_after']:.0f} file(s) "
          f"(target {args.target_rows:,} rows), median of {args.runs} runs")
    print(f"  compaction:                  {med['compact']:8.1f} ms")
    print(f"  scan (columns, all rows):    {med['scan_before']:8.1f} ms before, {med['scan_after']:8.1f} ms after "
          f"({med['scan_before'] / med['scan_after']:.1f}x)")
    print(f"  events (decode, as replay):  {med['decode_before']:8.1f} ms before, {med['decode_after']:8.1f} ms after "
          f"({med['decode_before'] / med['decode_after']:.1f}x)")


if __name__ == "__main__":
    main()
