"""Trace importers: one function per file layout, chosen by name (`IMPORTERS`) or by the header.

Every importer returns a `Trace` whose jobs passed `check_jobs`; a bad line is reported by number
and either skipped (`on_bad="skip"`, listed in `Trace.skipped`) or the whole file is refused
(`on_bad="refuse"`, raises `TraceError` listing every bad line). A file without the columns a
layout needs is always refused: no line of it can be read.

Layouts:

- `artifact`: the Rubick artifact's workload CSV (`data/rubick-artifact/README.md`), columns
  `name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla`
  (`duration`, `num_cpus`, `bandwidth` and `is_sla` optional; an extra `tenant` column is honoured).
- `pai`: the Alibaba PAI GPU trace (cluster-trace-gpu-v2020) task table, with or without its header:
  `job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type`
  (an optional `user` column becomes the tenant). See `read_pai` for how it maps onto jobs.
"""

from __future__ import annotations

import csv
import hashlib
import math
from pathlib import Path
from typing import Callable, Mapping

from controlplane.events import Plan

from .trace import DEFAULT_TENANT, Trace, TraceError, TraceJob, TraceProblem, check_jobs, decode_plan

ARTIFACT_REQUIRED = ("name", "submission_time", "application", "num_gpus", "exec_plan", "steps")
PAI_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time", "plan_cpu", "plan_mem",
               "plan_gpu", "gpu_type")
PAI_MODELS = ("vit", "roberta", "bert", "t5", "gpt2")
"""Model types a PAI job may become (each has measured ZeRO-DP rows on 1, 2, 4 and 8 GPUs of one node)."""
PAI_MAX_GPUS = 8
"""A PAI job runs on one 8-GPU node at most (the models' measured rows); one asking for more is capped,
and counted (`Trace.capped`)."""
PAI_MAX_CPUS = 96
"""CPUs of one node of the testbed (`replay.config.NODE_CPUS`): a job's CPU request is cut to its share
of the GPUs it keeps, then to one node, and counted (`Trace.capped`) where that cut it."""

IterTime = Callable[[str, Plan, int], "float | None"]
"""(model, plan, gpus on one node) -> seconds per iteration, or None if unknown."""


class _Bad(ValueError):
    pass


def _number(rec: Mapping[str, str], col: str, *, integer: bool = False, default: float | None = None) -> float:
    text = (rec.get(col) or "").strip()
    if not text:
        if default is not None:
            return default
        raise _Bad(f"missing value in column {col!r}")
    try:
        value = float(text)
    except ValueError:
        raise _Bad(f"column {col!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise _Bad(f"column {col!r}: {text!r} is not a finite number")
    if integer and value != int(value):
        raise _Bad(f"column {col!r}: {text!r} is not a whole number")
    return int(value) if integer else value


def _open(path: Path):
    """The file as text; bytes that are not UTF-8 are kept as surrogates, so that the line holding them
    is reported (`_undecodable`) instead of the whole read failing."""
    return open(path, newline="", encoding="utf-8", errors="surrogateescape")


def _undecodable(fields: list[str]) -> bool:
    """Whether a field holds bytes that were not UTF-8 (surrogates, which strict UTF-8 cannot encode)."""
    for f in fields:
        if not f.isascii():
            try:
                f.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def _records(reader):
    """(fields, problem) per line of a csv reader: a line the csv module cannot parse (a field over its
    size limit) or that is not UTF-8 text is a problem of that line, and reading goes on."""
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield None, f"not a CSV line: {exc}"
            continue
        yield fields, ("not UTF-8 text" if _undecodable(fields) else None)


def _first_line(path: Path) -> list[str] | None:
    """The first line's fields (stripped), None for an empty file; a first line that cannot be read
    refuses the file (it is the header, or a layout's first record)."""
    with _open(path) as fh:
        reader = csv.reader(fh)
        for fields, problem in _records(reader):
            if problem is not None:
                raise TraceError(str(path), [TraceProblem(1, problem)])
            return [c.strip() for c in fields]
    return None


def _rows(path: Path, header: tuple[str, ...] | None = None):
    """(line number, record, problem) for every data line; the header is line 1 unless given."""
    with _open(path) as fh:
        reader = csv.reader(fh)
        records = _records(reader)
        if header is None:
            first = next(records, None)
            if first is None:
                raise TraceError(str(path), [TraceProblem(0, "empty file: no header line")])
            if first[1] is not None:
                raise TraceError(str(path), [TraceProblem(1, f"header: {first[1]}")])
            header = tuple(c.strip() for c in first[0])
        yield header
        for fields, problem in records:
            line = reader.line_num
            if problem is not None:
                yield line, None, problem
                continue
            if not fields or all(not f.strip() for f in fields):
                continue
            if len(fields) != len(header):
                yield line, None, (f"{len(fields)} fields, the header has {len(header)} "
                                   f"({'missing columns' if len(fields) < len(header) else 'extra fields'})")
                continue
            yield line, dict(zip(header, fields)), None


def _finish(path: Path, layout: str, jobs: list[TraceJob], problems: list[TraceProblem],
            batches: Mapping[str, int], on_bad: str) -> Trace:
    good = list(jobs)
    later = check_jobs(good, batches)
    bad_lines = {p.line for p in later}
    problems = sorted(problems + later, key=lambda p: p.line)
    if problems and on_bad == "refuse":
        raise TraceError(str(path), problems, skippable=True)
    return Trace([j for j in good if j.line not in bad_lines], str(path), layout, problems)


def read_artifact(path: str | Path, batches: Mapping[str, int], *, on_bad: str = "refuse",
                  iter_time: IterTime | None = None) -> Trace:
    path = Path(path)
    rows = _rows(path)
    header = next(rows)
    missing = [c for c in ARTIFACT_REQUIRED if c not in header]
    if missing:
        raise TraceError(str(path), [TraceProblem(1, f"missing column(s) {', '.join(missing)}; the artifact "
                                                     f"layout needs {', '.join(ARTIFACT_REQUIRED)}")])
    jobs: list[TraceJob] = []
    problems: list[TraceProblem] = []
    for line, rec, problem in rows:
        if problem is not None:
            problems.append(TraceProblem(line, problem))
            continue
        try:
            gpus = _number(rec, "num_gpus", integer=True)
            if gpus <= 0:
                raise _Bad(f"zero or negative GPUs ({gpus})")
            steps = _number(rec, "steps", integer=True)
            if steps < 1:
                raise _Bad(f"steps must be >= 1, got {steps}")
            submit = _number(rec, "submission_time")
            if submit < 0:
                raise _Bad(f"negative submission time {_num(submit)}")
            sla = _number(rec, "is_sla", integer=True, default=0)
            if sla not in (0, 1):
                raise _Bad(f"is_sla must be 0 or 1, got {sla}")
            name, model = rec["name"].strip(), rec["application"].strip()
            if not name or not model:
                raise _Bad(f"missing value in column {'name' if not name else 'application'!r}")
            try:
                plan = decode_plan(rec["exec_plan"], gpus)
            except ValueError as exc:
                raise _Bad(str(exc)) from None
            cpus = _number(rec, "num_cpus", integer=True, default=0)
            if cpus < 0:
                raise _Bad(f"negative CPUs ({cpus})")
            duration = _number(rec, "duration", default=-1.0)
            jobs.append(TraceJob(line=line, name=name, submit_s=float(submit), model=model, gpus=gpus, cpus=cpus,
                                 plan=plan, steps=steps, guaranteed=bool(sla),
                                 tenant=(rec.get("tenant") or "").strip() or DEFAULT_TENANT,
                                 duration_s=None if duration < 0 else duration))
        except _Bad as exc:
            problems.append(TraceProblem(line, str(exc)))
    return _finish(path, "artifact", jobs, problems, batches, on_bad)


def pai_model(job_name: str) -> str:
    """The model type a PAI job becomes: a stable hash of its name picks one of PAI_MODELS."""
    digest = hashlib.sha256(job_name.encode()).digest()
    return PAI_MODELS[int.from_bytes(digest[:8], "big") % len(PAI_MODELS)]


PAI_JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
"""The PAI job table (`pai_job_table.csv`), with or without its header."""


def _headed_rows(path: Path, columns: tuple[str, ...], required: tuple[str, ...]):
    """The data rows of a PAI table published with or without its header (`columns` when without); a file
    that is empty or lacks a `required` column is refused."""
    first = _first_line(path)
    if first is None:
        raise TraceError(str(path), [TraceProblem(0, "empty file")])
    rows = _rows(path, None if "job_name" in first else columns)
    header = next(rows)
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(str(path), [TraceProblem(1, f"missing column(s) {', '.join(missing)}")])
    return rows


def _named(rows, problems: list[TraceProblem]):
    """(line, record, job name) of each readable row of a PAI table; a line that cannot be read, or has no
    job name, goes to `problems`."""
    for line, rec, problem in rows:
        if problem is None and not rec["job_name"].strip():
            problem = "missing value in column 'job_name'"
        if problem is not None:
            problems.append(TraceProblem(line, problem))
            continue
        yield line, rec, rec["job_name"].strip()


def read_pai_jobs(path: str | Path) -> dict[str, tuple[str, float]]:
    """job name -> (user, submission time) from the PAI job table. A line that cannot be read refuses the
    file with every bad line named (the table only adds facts; a half-read one would change them silently)."""
    path = Path(path)
    rows = _headed_rows(path, PAI_JOB_COLUMNS, ("job_name", "user", "start_time"))
    out: dict[str, tuple[str, float]] = {}
    problems: list[TraceProblem] = []
    for line, rec, name in _named(rows, problems):
        try:
            out[name] = ((rec.get("user") or "").strip(), _number(rec, "start_time"))
        except _Bad as exc:
            problems.append(TraceProblem(line, str(exc)))
    if problems:
        raise TraceError(str(path), problems)
    return out


def read_pai(path: str | Path, batches: Mapping[str, int], *, on_bad: str = "refuse",
             iter_time: IterTime | None = None, jobs_table: str | Path | None = None) -> Trace:
    """The PAI task table as jobs. The trace has no model types, plans or iteration counts, so:

    - only tasks with status `Terminated` that asked for GPUs (`plan_gpu` > 0, in percent of one GPU)
      are replayed; the others are listed in `Trace.filtered`, never as bad;
    - a job's GPUs = ceil(sum over its tasks of inst_num * plan_gpu / 100), rounded up to a power of
      two and capped at one 8-GPU node; its CPUs = ceil(sum of inst_num * plan_cpu / 100), cut to the
      share of the GPUs it keeps and to one node's 96 (each job cut listed in `Trace.capped`); its
      submission = its earliest task start, its duration = latest end - earliest start;
    - its model is `pai_model(job_name)`, its plan ZeRO-DP over all its GPUs (measured for every
      PAI_MODELS type on 1, 2, 4 and 8 GPUs), its steps = duration / measured iteration time
      (at least 1);
    - the tenant is the `user` column where present.
    With `jobs_table` (the trace's `pai_job_table.csv`), a job found there takes its user as tenant and
    its submission time from it (a job waits between submission and its first task's start); the others
    keep the task table's. Jobs are ordered by submission time, then name.
    """
    joined = read_pai_jobs(jobs_table) if jobs_table is not None else {}
    path = Path(path)
    rows = _headed_rows(path, PAI_COLUMNS, PAI_COLUMNS)
    problems: list[TraceProblem] = []
    filtered: list[TraceProblem] = []
    groups: dict[str, dict] = {}
    for line, rec, name in _named(rows, problems):
        try:
            if rec["status"].strip() != "Terminated":
                filtered.append(TraceProblem(line, f"filtered: status {rec['status'].strip()!r}"))
                continue
            share = _number(rec, "plan_gpu", default=0.0)
            if share < 0:
                raise _Bad(f"zero or negative GPUs (plan_gpu {_num(share)})")
            if share == 0:
                filtered.append(TraceProblem(line, "filtered: no GPU asked for"))
                continue
            inst = _number(rec, "inst_num", default=1.0)
            start, end = _number(rec, "start_time"), _number(rec, "end_time")
            if end < start:
                raise _Bad(f"end_time {_num(end)} before start_time {_num(start)}")
            g = groups.setdefault(name, {"line": line, "gpus": 0.0, "start": start, "end": end,
                                         "cpus": 0.0, "user": (rec.get("user") or "").strip()})
            g["gpus"] += inst * share / 100.0
            g["cpus"] += inst * _number(rec, "plan_cpu", default=0.0) / 100.0
            g["start"], g["end"] = min(g["start"], start), max(g["end"], end)
        except _Bad as exc:
            problems.append(TraceProblem(line, str(exc)))
    if not groups and not problems:
        raise TraceError(str(path), [TraceProblem(0, "no GPU job with status Terminated in the file")])
    for name, g in groups.items():  # the job table's submission (never after the first task starts) and user
        if name in joined:
            user, submitted = joined[name]
            g["submit"] = min(submitted, g["start"])
            g["user"] = user or g["user"]
        else:
            g["submit"] = g["start"]
    t0 = min((g["submit"] for g in groups.values()), default=0.0)
    jobs = []
    capped: list[TraceProblem] = []
    for name, g in sorted(groups.items(), key=lambda kv: (kv[1]["submit"], kv[0])):
        asked = max(1, math.ceil(g["gpus"] - 1e-9))
        gpus = min(PAI_MAX_GPUS, 1 << (asked - 1).bit_length())
        asked_cpus = max(0, math.ceil(g["cpus"] - 1e-9))
        cpus = min(PAI_MAX_CPUS, math.ceil(asked_cpus * min(1.0, gpus / asked) - 1e-9))
        if asked > PAI_MAX_GPUS or cpus < asked_cpus:
            what = (f"{asked} GPUs and {asked_cpus} CPUs, replayed on {gpus} and {cpus}" if cpus < asked_cpus
                    else f"{asked} GPUs, replayed on {gpus}")
            capped.append(TraceProblem(g["line"], f"capped: job {name} asked for {what} (one node: "
                                                  f"{PAI_MAX_GPUS} GPUs, {PAI_MAX_CPUS} CPUs)"))
        model = pai_model(name)
        plan = Plan(dp=gpus, zero_stage=2)
        duration = g["end"] - g["start"]
        t = iter_time(model, plan, gpus) if iter_time is not None else None
        steps = max(1, round(duration / t)) if t else max(1, round(duration))
        jobs.append(TraceJob(line=g["line"], name=name, submit_s=g["submit"] - t0, model=model, gpus=gpus,
                             cpus=cpus, plan=plan, steps=steps,
                             tenant=_tenant(g["user"]), duration_s=duration))
    trace = _finish(path, "pai", jobs, problems, batches, on_bad)
    trace.filtered = filtered
    kept = {j.line for j in trace.jobs}
    trace.capped = [c for c in capped if c.line in kept]
    return trace


def _num(x: float) -> str:
    """A number as written in a trace, never in exponent form (a PAI time is 1705270, not 1.70527e+06)."""
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else repr(x)


def _tenant(user: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in user)[:128]
    return safe if safe and safe[0].isalnum() else DEFAULT_TENANT


IMPORTERS: dict[str, Callable[..., Trace]] = {"artifact": read_artifact, "pai": read_pai}


def detect_layout(path: str | Path) -> str:
    first = _first_line(path) or []
    if "application" in first and "exec_plan" in first:
        return "artifact"
    if "job_name" in first or (len(first) == len(PAI_COLUMNS) and "plan_gpu" not in first):
        return "pai"
    return "artifact"  # reports its missing columns


def read_trace(path: str | Path, batches: Mapping[str, int], *, layout: str = "auto", on_bad: str = "refuse",
               iter_time: IterTime | None = None, jobs_table: str | Path | None = None) -> Trace:
    if on_bad not in ("skip", "refuse"):
        raise ValueError("on_bad must be 'skip' or 'refuse'")
    if not Path(path).is_file():
        why = "a folder, not a trace file" if Path(path).is_dir() else "no such file"
        raise TraceError(str(path), [TraceProblem(0, why)])
    name = detect_layout(path) if layout == "auto" else layout
    if name not in IMPORTERS:
        raise ValueError(f"unknown trace layout {name!r} (known: {', '.join(sorted(IMPORTERS))})")
    if jobs_table is not None:
        if name != "pai":
            raise ValueError(f"a job table joins the pai layout only, not {name}")
        return read_pai(path, batches, on_bad=on_bad, iter_time=iter_time, jobs_table=jobs_table)
    return IMPORTERS[name](path, batches, on_bad=on_bad, iter_time=iter_time)
