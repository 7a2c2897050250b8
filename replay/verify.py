"""Deterministic replay: feed a recorded run's inputs to fresh cores and compare their answers.

The control-plane cores named in `run.json` (admission, modeler, policy) are rebuilt from the
recorded configuration and starting parameters. The recorded stream is walked in sequence order:
an event one of those cores produced in the run is compared, byte for byte, with what the rebuilt
core produces now (each core's answers are matched in the order it gave them); every recorded event
is then delivered to the cores that subscribe to it, as in the run. Everything else in the log
(submissions, node events, the agents' lifecycle events and measured iterations, clock ticks) is
an input. The first difference stops the check; it is reported with both versions and the events
just before it.

Each core's answers depend only on the log, so the cores can be checked in processes of their own
(`jobs`, Linux: forked once the cores are built and the log's rows read, each decoding what it needs) and
their first differences merged: the result is the same as a check in one process.

A missing, unreadable or extra file, or a file whose bytes differ from the run's manifest (run.json's
`files`, else the recorder's `manifest-<stream>.jsonl`: `controlplane.eventlog.check`), is reported by
name, with or without run.json; the check stops at the first gap in the stream and says which decisions it could not check.

A live run (`rubick up --sim-cluster`, `kind: "live"` in run.json, see `replay.live`) is checked the
same way, with what a live deployment adds: each core consumed the stream on its own, so an event is
handed to a rebuilt core only up to the last event that core handled in the run (`consumed`); bytes
that are not a valid event are inputs no core sees, and the admission service's `*.rejected` answer
to them is rebuilt and compared (all but its time, which is when the stream stored the bytes). A live
run that did not stop cleanly has no `consumed`: answers the rebuilt cores give to its last events
are then reported as not recorded, not as a difference.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from controlplane import gc_tuning
from controlplane.eventlog import check, scan
from controlplane.events import Event, Invalid, decode, encode, to_plain, unpack
from controlplane.events.catalog import UnknownSubject, base_subject
from controlplane.bus.base import Delivery, matches_any
from controlplane.service import answers

from .config import PolicyFactory
from .record import read_run


@dataclass
class Divergence:
    seq: int
    core: str
    recorded: Any
    replayed: Any
    before: list[tuple[int, float, str, str, str]]
    """(seq, time, subject, id, source) of the events just before."""


@dataclass
class VerifyResult:
    checked: dict[str, int] = field(default_factory=dict)
    """Base subject -> answers compared and equal."""
    plan_decided_recorded: int = 0
    divergence: Divergence | None = None
    problems: list[str] = field(default_factory=list)
    unchecked_from_seq: int | None = None
    """Sequence from which nothing could be checked (a gap, a bad row), else None."""
    events: int = 0
    seconds: float = 0.0
    simulated_s: float = 0.0
    live: bool = False
    """A live run's log (`rubick up --sim-cluster`)."""
    span_s: float = 0.0
    """Time from the first to the last event fed."""
    notes: list[str] = field(default_factory=list)
    """What was not compared, and why (not a difference)."""
    processes: int = 1
    """Processes that checked the cores side by side."""

    @property
    def ok(self) -> bool:
        return self.divergence is None and not self.problems and self.unchecked_from_seq is None


def _plain(data: bytes) -> Any:
    try:
        return unpack(data)
    except Invalid as exc:
        return f"<{exc}>"


def load_recorded(log_dir: Path, run: dict[str, Any], result: VerifyResult,
                  undecodable: dict[int, tuple[str, bytes, Invalid]] | None = None) -> list[tuple[int, Event, bytes]]:
    """The recorded events in sequence order, up to the first gap or undecodable row. With
    `undecodable` (a live run), an undecodable row is put there by sequence and the walk goes on."""
    return decode_rows(read_rows(log_dir, run, result), result, undecodable)


def read_rows(log_dir: Path, run: dict[str, Any], result: VerifyResult) -> tuple[list[tuple[int, str, bytes]], int]:
    """(the log's rows as (sequence, subject, bytes), in sequence order; the last sequence the run's files list),
    after comparing the files with the run's manifest (`controlplane.eventlog.check`)."""
    for path, why in check(log_dir, run.get("files")):
        result.problems.append(f"{path.name}: {why}")
    logscan = scan(log_dir, ["subject", "data"])
    for path, why in logscan.problems:
        result.problems.append(f"{path.name}: {why}")
    rows = logscan.frame.sort("seq").select("seq", "subject", "data").rows()
    return rows, max((f["last_seq"] for f in run.get("files", [])), default=0)


def decode_rows(read: tuple[list[tuple[int, str, bytes]], int], result: VerifyResult,
                undecodable: dict[int, tuple[str, bytes, Invalid]] | None = None,
                passed: Callable[[str, bytes], _Passed | None] | None = None) -> list[tuple[int, Any, bytes]]:
    """`load_recorded` of the rows `read_rows` read. `passed` (a child's check, `_passer`): a row it answers for is
    not decoded, its `_Passed` stands in for the event."""
    rows, last = read
    out: list[tuple[int, Any, bytes]] = []
    expect = 1
    for seq, subject, data in rows:
        if seq != expect:
            result.unchecked_from_seq = expect
            result.problems.append(f"events {expect}..{seq - 1} are not in the log: nothing from event {expect} "
                                   "on can be checked")
            break
        if passed is not None:
            stand_in = passed(subject, data)
            if stand_in is not None:
                out.append((seq, stand_in, data))
                expect += 1
                continue
        try:
            out.append((seq, decode(data, subject), data))
        except Invalid as exc:
            if undecodable is not None:
                undecodable[seq] = (subject, data, exc)
                expect += 1
                continue
            result.unchecked_from_seq = seq
            result.problems.append(f"event {seq} ({subject}) cannot be decoded ({exc}): nothing from it on can be "
                                   "checked")
            break
        expect += 1
    if result.unchecked_from_seq is None and expect <= last:
        result.unchecked_from_seq = expect
        result.problems.append(f"events {expect}..{last} of the run are not in the log: not checked")
    return out


class _Passed:
    """In a child's check, a row none of its cores reads or answered: what `_walk` reads of an event (its base
    subject, its source and time), from the envelope alone, not decoded and not validated."""

    __slots__ = ("base", "source", "time")

    def __init__(self, base: str, source: str, time: Any) -> None:
        self.base, self.source, self.time = base, source, time


def _passer(cores: list[Any], sources: dict[str, list[str]]) -> Callable[[str, bytes], _Passed | None]:
    """For a child checking `cores`: a row's `_Passed`, where no core of them subscribes to its subject and its
    envelope's source is none of theirs (no answer of theirs to compare); None where the row is to be decoded (as
    is every row whose envelope cannot be read: its failure is this process's to report, and the walk of the
    child stops where this process's does, `verify`)."""
    own = {src for c in cores for src in sources.get(c.name, [])}
    routed: dict[str, bool] = {}

    def passed(subject: str, data: bytes) -> _Passed | None:
        try:
            base = base_subject(subject)
            obj = unpack(data)
        except (UnknownSubject, Invalid):
            return None
        if not isinstance(obj, dict):
            return None
        source = obj.get("source")
        if not isinstance(source, str) or source in own or obj.get("subject") != subject:
            return None
        hit = routed.get(base)
        if hit is None:
            hit = routed[base] = any(matches_any(c.subjects, base) for c in cores)
        return None if hit else _Passed(base, source, obj.get("time"))

    return passed


@dataclass
class _Walk:
    """What walking the recorded stream with some of the cores found. Positions are indexes into the
    recorded list, so walks of different cores over the same stream can be merged."""

    checked: list[tuple[int, str]] = field(default_factory=list)
    """(position, base subject) of each answer compared and equal."""
    divergence: tuple[int, str, Any, Any] | None = None
    """(position, core, recorded, replayed) of the first answer that differs."""
    leftovers: dict[str, tuple[int, Any]] = field(default_factory=dict)
    """Core -> (count, first) of its answers to the last events that are not in the log."""


@dataclass(frozen=True)
class _Stream:
    recorded: list[tuple[int, Event, bytes]]
    limit: dict[str, int] | None
    undecodable: dict[int, tuple[str, bytes, Invalid]] | None
    live: bool
    """A live run: its admission core answered bytes that are not a valid event (`undecodable`)."""
    sources: dict[str, list[str]]


PROGRESS_EVERY = 1024
"""Events fed between two calls of a check's progress callback."""


def _walk(stream: _Stream, cores: list[Any], progress: Callable[[int, int, float], None] | None = None) -> _Walk:
    """Feed the recorded stream to `cores` and compare their answers with the recorded ones, up to the
    first difference. The other cores' recorded answers are inputs, so each core's answers depend only
    on the log: the cores can be walked apart and the walks merged. `progress` (display only) is told
    (events fed, events recorded, simulated time) every PROGRESS_EVERY events."""
    walk = _Walk()
    total = len(stream.recorded)
    owner = {src: c.name for c in cores for src in stream.sources.get(c.name, [])}
    routes: dict[str, list[Any]] = {}
    produced: dict[str, deque[tuple[Event, bytes]]] = {c.name: deque() for c in cores}
    limit, undecodable = stream.limit, stream.undecodable
    admission = stream.live and any(c.name == "admission" for c in cores)
    for i, (seq, event, data) in enumerate(stream.recorded):
        if progress is not None and i % PROGRESS_EVERY == 0:
            progress(i, total, event.time)
        core = owner.get(event.source)
        refused = _refused_seq(event) if admission and core == "admission" else None
        if refused is not None and refused in undecodable:
            subject, bad, exc = undecodable[refused]
            mine_bytes = _shell_rejection(subject, bad, refused, exc, event.time)
            if mine_bytes != data:
                walk.divergence = (i, "admission", _plain(data), None if mine_bytes is None else _plain(mine_bytes))
                return walk
            walk.checked.append((i, event.base))
        elif core is not None:
            queue = produced[core]
            mine_bytes = queue.popleft()[1] if queue else None
            if mine_bytes != data:
                walk.divergence = (i, core, _plain(data), None if mine_bytes is None else _plain(mine_bytes))
                return walk
            walk.checked.append((i, event.base))
        base = event.base
        subs = routes.get(base)
        if subs is None:
            subs = routes[base] = [c for c in cores if matches_any(c.subjects, base)]
        for c in subs:
            if limit is not None and seq > limit[c.name]:
                continue  # the run stopped before this core handled it
            produced[c.name].extend(answers(c, event, seq)[0])  # as the live shell answers, failures too
    walk.leftovers = {name: (len(q), _plain(q[0][1])) for name, q in produced.items() if q}
    return walk


def _weight(core: Any) -> int:
    """How long a core's check takes, roughly: the modeler's refits (with, in a process of its own, the import of the
    least-squares fit), then the policy's rounds."""
    return {"modeler": 4, "policy": 3}.get(core.name, 1)


def _groups(cores: list[Any], jobs: int) -> list[list[Any]]:
    """At most `jobs` groups of cores. The cores that read only some subjects are spread by `_weight`, the heaviest
    first, each to the lightest group so far. The first group is checked in this process, which decodes every event
    (it reports on all of them; a child decodes only what its cores read, `_passer`): it is the lightest, and the
    cores that read every subject (admission) join it."""
    every = [c for c in cores if ">" in c.subjects]
    rest = [c for c in cores if ">" not in c.subjects]
    if jobs <= 1 or len(rest) <= 1:
        return [list(cores)]
    groups: list[list[Any]] = [[] for _ in range(min(jobs, len(rest)))]
    for core in sorted(rest, key=_weight, reverse=True):
        min(groups, key=lambda g: sum(map(_weight, g))).append(core)
    groups.sort(key=lambda g: sum(map(_weight, g)))
    groups[0] = every + groups[0]
    return [sorted(g, key=cores.index) for g in groups]


def default_jobs() -> int:
    """Processes a check may use: one per CPU this process may run on, where the cores can be forked with
    the log already read (Linux); else 1."""
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return len(os.sched_getaffinity(0))


def _child(conn: Any, load: Callable[[list[Any]], _Stream], cores: list[Any]) -> None:
    try:
        answer: tuple[str, Any] = ("ok", _walk(load(cores), cores))
    except BaseException as exc:  # handed to the parent, which raises it
        text = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        answer = ("error", (exc, text))
    conn.send(answer)
    conn.close()


def _walk_apart(load: Callable[[list[Any] | None], _Stream], groups: list[list[Any]],
                progress: Callable[[int, int, float], None] | None = None) -> tuple[_Stream, list[_Walk]]:
    """The first group in this process (told to `progress`), each other one in a forked child. The children are
    forked before the log's rows are decoded: each decodes those its cores read on its own (`load(group)`), side by
    side with this process (`load(None)`: all of them), and what a core imports on its first use (the modeler's
    least-squares fit) is imported there meanwhile. Returns this process's stream and the walks, in the order of
    `groups`."""
    ctx = multiprocessing.get_context("fork")
    children = []
    try:
        for group in groups[1:]:
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(send, load, group), daemon=True)
            proc.start()
            send.close()
            children.append((group, proc, recv))
        stream = load(None)
        walks = [_walk(stream, groups[0], progress)]
        for group, proc, recv in children:
            names = ", ".join(c.name for c in group)
            try:
                status, value = recv.recv()
            except EOFError:
                proc.join()
                raise RuntimeError(f"the check of the {names} core(s) stopped without an answer "
                                   f"(exit code {proc.exitcode})") from None
            if status == "error":
                exc, text = value
                exc.add_note(f"raised while checking the {names} core(s), in a child process:\n{text}")
                raise exc
            walks.append(value)
        return stream, walks
    finally:
        for _, proc, recv in children:
            recv.close()
            if proc.is_alive():
                proc.kill()
            proc.join()


@gc_tuning.pausing  # the cores and the decoding make no reference cycles (`controlplane.gc_tuning`)
def verify(log_dir: str | Path, *, policy_factory: PolicyFactory | None = None, context: int = 5,
           only: tuple[str, ...] | str | None = None, jobs: int | None = None,
           progress: Callable[[int, int, float], None] | None = None) -> VerifyResult:
    """Check the run in `log_dir`. `only` names the cores to rebuild (e.g. `("policy",)`, or one name as a
    string); the recorded answers of the others are then inputs like the rest (faster: the modeler's refits are
    not redone). `jobs` is how many processes check the cores at once (default `default_jobs()`): each core's
    answers depend on the log alone, so the policy's check and the modeler's can run side by side; the
    result is the same as with one. `progress` (display only) is told how far the check got: (events
    fed, events recorded, simulated time), by this process's share where there are several."""
    t0 = time.perf_counter()
    log_dir = Path(log_dir)
    result = VerifyResult()
    try:
        run = read_run(log_dir)
    except FileNotFoundError:
        result.problems.append("run.json: missing, so the cores that made the run cannot be rebuilt; nothing "
                               "checked")
        result.problems.extend(f"{path.name}: {why}" for path, why in check(log_dir))
        return result
    except ValueError as exc:
        result.problems.append(f"run.json: unreadable ({exc}); nothing checked")
        result.problems.extend(f"{path.name}: {why}" for path, why in check(log_dir))
        return result
    from .live import rebuilt_cores

    cores = rebuilt_cores(run, policy_factory)
    if run.get("from_log"):
        result.notes.append("no run.json: the cores were rebuilt from the run descriptions in the log (run.described)")
    if run.get("earlier_configs"):
        result.notes.append(f"the run was started {run.get('starts', '?')} times and its configuration or starting "
                            f"parameters changed in between ({len(run['earlier_configs'])} earlier one(s) in "
                            "run.json): the cores are rebuilt with the last, so decisions made under an earlier "
                            "one may differ")
    if isinstance(only, str):  # one core's name, not the letters of one
        only = (only,)
    if only is not None:
        unknown = sorted(set(only) - {c.name for c in cores})
        if unknown or not only:
            raise ValueError(f"no core named {', '.join(unknown) or '(none given)'} (cores: "
                             f"{', '.join(c.name for c in cores)})")
        cores = [c for c in cores if c.name in only]
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    result.live = run.get("kind") == "live"
    undecodable: dict[int, tuple[str, bytes, Invalid]] | None = {} if result.live else None
    consumed = run.get("consumed") if result.live else None
    limit = {c.name: int(consumed.get(c.name, 0)) for c in cores} if consumed is not None else None
    read = read_rows(log_dir, run, result)  # before any fork: the log's reader runs threads of its own

    def load(group: list[Any] | None) -> _Stream:
        """The stream this process walks (`group` None: every row decoded, the result told), or a child's."""
        if group is None:
            return _Stream(decode_rows(read, result, undecodable), limit, undecodable, result.live, run["sources"])
        bad = {} if result.live else None  # a live run's undecodable rows are inputs: every one decoded
        passed = None if result.live else _passer(group, run["sources"])
        return _Stream(decode_rows(read, VerifyResult(), bad, passed), limit, bad, result.live, run["sources"])

    groups = _groups(cores, default_jobs() if jobs is None else jobs)
    if len(groups) == 1:
        stream = load(None)
        walks = [_walk(stream, groups[0], progress)]
    else:
        stream, walks = _walk_apart(load, groups, progress)
    recorded = stream.recorded
    result.plan_decided_recorded = sum(1 for _, e, _ in recorded if e.base == "plan.decided")
    if progress is not None and recorded:
        progress(len(recorded), len(recorded), recorded[-1][1].time)
    result.processes = len(groups)

    # a child decodes only what its cores read: where this process stopped at a row it could not decode, the child
    # may have walked on; what it found past that row is not the check's
    first = min((w.divergence for w in walks if w.divergence is not None and w.divergence[0] < len(recorded)),
                key=lambda d: d[0], default=None)
    fed = len(recorded) if first is None else first[0]
    for w in walks:
        for i, base in w.checked:
            if i < fed:
                result.checked[base] = result.checked.get(base, 0) + 1
    before = [(seq, e.time, e.subject, e.id, e.source) for seq, e, _ in recorded[max(0, fed - context):fed]]
    if first is not None:
        i, core, recorded_answer, replayed = first
        result.divergence = Divergence(recorded[i][0], core, recorded_answer, replayed, before)
    result.events = fed
    if fed:
        result.simulated_s = recorded[fed - 1][1].time
        result.span_s = result.simulated_s - recorded[0][1].time
    if result.divergence is None and result.unchecked_from_seq is None:
        leftovers = {name: left for w in walks for name, left in w.leftovers.items()}
        for name in (c.name for c in cores if c.name in leftovers):
            count, extra = leftovers[name]
            if result.live and consumed is None:
                result.notes.append(f"{count} answer(s) of the {name} core to the last events are not in the "
                                    "log (the run did not stop cleanly, so they may never have been given); "
                                    "not compared")
                continue
            result.divergence = Divergence((recorded[-1][0] if recorded else 0) + 1, name, None, extra, before)
            break
    if result.live and consumed is None and result.unchecked_from_seq is None:
        result.notes.append("run.json has no record of what each core had handled (the run did not stop "
                            "cleanly): every event was handed to every core")
    result.seconds = time.perf_counter() - t0
    return result


def _refused_seq(event: Event) -> int | None:
    """The stream sequence an admission shell's `rej-seq-<n>` answer refers to."""
    if event.id.startswith("rej-seq-") and event.id[8:].isdigit():
        return int(event.id[8:])
    return None


def _shell_rejection(subject: str, data: bytes, seq: int, exc: Invalid, t: float) -> bytes | None:
    """The admission shell's answer to undecodable bytes, at the recorded answer's time."""
    from controlplane.service import rejection_for

    answer = rejection_for(Delivery(subject, data, seq, None, t), exc, "admission")
    return None if answer is None else encode(answer)


def format_result(result: VerifyResult, log_dir: Path) -> str:
    span = (f"a live run spanning {result.span_s:,.0f} s of its clock" if result.live
            else f"{result.simulated_s / 3600:.1f} simulated hours")
    procs = f", {result.processes} processes" if result.processes > 1 else ""
    lines = [f"replay of {log_dir}: {result.events} events fed in {result.seconds:.2f} s ({span}{procs})"]
    for p in result.problems:
        lines.append(f"problem: {p}")
    for n in result.notes:
        lines.append(f"note: {n}")
    checked = ", ".join(f"{k} {v}" for k, v in sorted(result.checked.items())) or "nothing"
    lines.append(f"reproduced byte for byte: {checked} "
                 f"(plan.decided: {result.checked.get('plan.decided', 0)} of {result.plan_decided_recorded} recorded)")
    d = result.divergence
    if d is not None:
        lines.append(f"DIVERGED at event {d.seq} (answer of the {d.core} core)")
        lines.append("  events just before:")
        for seq, t, subject, eid, source in d.before:
            lines.append(f"    #{seq} t={t:.3f} {subject} id={eid} source={source}")
        lines.append(f"  recorded: {_show(d.recorded)}")
        lines.append(f"  replayed: {_show(d.replayed)}")
        if result.problems:
            lines.append("  (the log has the problems above: this difference may come from them, not from the cores)")
    elif result.ok:
        lines.append("OK: every recorded decision was reproduced")
    return "\n".join(lines)


def _show(value: Any) -> str:
    if value is None:
        return "(nothing)"
    text = repr(to_plain(value) if not isinstance(value, (dict, list, str)) else value)
    return text if len(text) <= 4000 else text[:4000] + "..."
