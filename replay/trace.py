"""Traces: jobs to submit at given times, read from a file, checked line by line.

A `TraceJob` is one row of a trace after decoding; `submission()` turns it into the
`job.submitted` payload the simulator publishes at `submit_s`. Importers (`replay.importers`)
read the different file layouts into TraceJobs and report every bad line by number; the user
chooses whether a bad line is skipped (and counted) or refuses the whole file.

The 10x trace is derived from a base trace by `scale_trace` (see its rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from controlplane.events import JobSubmitted, ModelRef, Plan, Resources
from controlplane.events import Invalid, decode, encode, make

DEFAULT_TENANT = "default"


class TraceError(ValueError):
    """A trace that cannot be used (refused), with every problem found. `skippable`: the problems are
    bad lines that `on_bad="skip"` would leave out; otherwise no line of the file can be used (no file,
    no header, missing columns)."""

    def __init__(self, path: str, problems: list["TraceProblem"], *, skippable: bool = False) -> None:
        self.path = path
        self.problems = problems
        self.skippable = skippable
        if not skippable and len(problems) == 1:
            super().__init__(f"{path}: {problems[0]}")
            return
        lines = "\n".join(f"  {p}" for p in problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        super().__init__(f"{path}: {len(problems)} bad line(s)\n{lines}{more}")


@dataclass(frozen=True)
class TraceProblem:
    line: int
    """1-based line number in the file (the header is line 1); 0 for the file as a whole."""
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}" if self.line else self.reason


@dataclass(frozen=True)
class TraceJob:
    line: int
    name: str
    submit_s: float
    model: str
    gpus: int
    cpus: int
    plan: Plan
    steps: int
    guaranteed: bool = False
    tenant: str = DEFAULT_TENANT
    duration_s: float | None = None

    def submission(self, global_batch_size: int) -> JobSubmitted:
        return JobSubmitted(job_id=self.name, tenant=self.tenant, guaranteed=self.guaranteed,
                            model=ModelRef(type=self.model), global_batch_size=global_batch_size,
                            plan=self.plan, resources=Resources(gpus=self.gpus, cpus=self.cpus),
                            target_iterations=self.steps)


@dataclass
class Trace:
    jobs: list[TraceJob]
    source: str
    layout: str
    skipped: list[TraceProblem] = field(default_factory=list)
    """Bad lines left out (`on_bad="skip"`)."""
    filtered: list[TraceProblem] = field(default_factory=list)
    """Lines a layout does not replay by design (e.g. PAI tasks without GPUs); never errors."""
    capped: list[TraceProblem] = field(default_factory=list)
    """Jobs replayed with less than they asked for (e.g. a PAI job over one node), each with what it asked."""


def decode_plan(code: str, gpus: int) -> Plan:
    """The artifact's plan code (data/rubick-artifact/README.md) for a job of `gpus` GPUs.

    Three digits `XYZ` = PP X, TP Y, DP Z; `ga` = DP over every GPU; `gc` = DP with gradient
    checkpointing; `zero-dp` = ZeRO stage 2; `zero-offload` = stage 2 with the optimizer on the CPU
    (`+gc` adds checkpointing); `tp+ga` = TP over every GPU. Raises ValueError for anything else.
    """
    code = code.strip()
    if len(code) == 3 and code.isdigit():
        pp, tp, dp = (int(c) for c in code)
        if 0 in (pp, tp, dp):
            raise ValueError(f"plan {code!r}: a parallel degree of 0")
        if pp * tp * dp != gpus:
            raise ValueError(f"plan {code!r} uses PP*TP*DP = {pp * tp * dp} GPUs, the job asks for {gpus}")
        return Plan(dp=dp, tp=tp, pp=pp)
    plans = {"ga": Plan(dp=gpus), "gc": Plan(dp=gpus, gc=True), "zero-dp": Plan(dp=gpus, zero_stage=2),
             "zero-offload": Plan(dp=gpus, zero_stage=2, offload=True),
             "zero-offload+gc": Plan(dp=gpus, zero_stage=2, offload=True, gc=True), "tp+ga": Plan(tp=gpus)}
    if code not in plans:
        raise ValueError(f"unknown plan code {code!r} (expected PTD digits, ga, gc, zero-dp, zero-offload, "
                         "zero-offload+gc or tp+ga)")
    return plans[code]


def check_jobs(jobs: list[TraceJob], batches: Mapping[str, int]) -> list[TraceProblem]:
    """Rules that span rows or need the model specs: unknown model, duplicate name, submission time
    going backwards, and the `job.submitted` schema itself (batch divisible by DP, ids, ranges)."""
    problems: list[TraceProblem] = []
    seen: set[str] = set()
    last = 0.0
    for job in jobs:
        why = None
        if job.model not in batches:
            why = f"unknown model {job.model!r} (known: {', '.join(sorted(batches))})"
        elif job.name in seen:
            why = f"job name {job.name!r} used twice"
        elif job.submit_s < last:
            why = f"submission time {job.submit_s:.3f} s goes backwards (previous job at {last:.3f} s)"
        else:
            try:  # the schema's own validation, exactly as a live submission gets it
                sub = job.submission(batches[job.model])
                decode(encode(make("job.submitted", sub, time=job.submit_s, id="x", source="trace")))
            except Invalid as exc:
                why = f"not a valid submission: {exc}"
        if why is not None:
            problems.append(TraceProblem(job.line, why))
            continue
        seen.add(job.name)
        last = job.submit_s
    return problems


def scale_trace(jobs: list[TraceJob], factor: int) -> list[TraceJob]:
    """The documented rule for an N-times trace: every job is repeated `factor` times; copy k
    (0-based) is named `<name>.<k>` and submitted k seconds after the original. On a cluster N times
    as large this keeps the base trace's load per GPU and arrival pattern. Deterministic."""
    if factor < 1:
        raise ValueError("scale factor must be >= 1")
    if factor == 1:
        return list(jobs)
    out = [replace(j, name=f"{j.name}.{k}", submit_s=j.submit_s + k) for j in jobs for k in range(factor)]
    out.sort(key=lambda j: (j.submit_s, j.line, j.name))
    return out
