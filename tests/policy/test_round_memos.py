"""The round's memos change no decision: a busy cluster driven through the policy core (holds on, as a
deployed core runs, guarantees and best-effort jobs, completions, arrivals, the agents' answers, measured
iterations and a refit), once as it runs and once with the memos off (every job's record of a round made
new, not the last round's made again or kept asleep, and every waiting job tried), publishes the same events
byte for byte."""

from __future__ import annotations

import copy
import math
import random
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest

from controlplane.events import (ClockTick, JobCompleted, JobPreempted, JobReconfigured, JobStarted, MetricsIteration,
                                 ModelUpdated, Plan, encode, make)
from controlplane.events.payloads import JobControl, NodeLost
from modeler.perf_model import PerfParams
from modeler.service import make_core
from policy import engine as engine_mod
from policy import engine_guarantees, engine_index, engine_search, records
from policy.curves import Best, packed
from policy.oracle import from_modeler
from policy.plans import canonical
from policy.registry import make_policy

from .helpers import CLOCK_FIELDS, UNREAD, job, node, resting_unread

MODELER = make_core()
KINDS = [("gpt2", 1, Plan(dp=1)), ("gpt2", 4, Plan(dp=4, zero_stage=2)), ("bert", 2, Plan(dp=2)),
         ("vit", 1, Plan(dp=1)), ("vit", 8, Plan(dp=8)), ("roberta", 4, Plan(dp=4)), ("t5", 2, Plan(dp=2)),
         ("llama7", 4, Plan(dp=4, zero_stage=2, offload=True)), ("gpt2", 2, Plan(dp=2, zero_stage=2, offload=True))]


def drive(seed: int, nodes: int = 12, jobs: int = 90, steps: int = 40, cpus: int = 96,
          mem_gb: float = 1600.0, owners: bool = False, short: bool = False,
          hold_s: float | None = None, policy: str = "rubick",
          lengths: tuple[int, ...] | None = None, quota: int | None = None,
          backoff: float = 0.0) -> tuple[list[bytes], object]:
    """A core's answers to a random workload (`owners`: with waiting jobs cancelled and suspended now and then, and
    every node lost for a while; `short`: two jobs in three with few iterations, less than a restart takes at most speeds;
    `lengths`: the jobs' iterations, taken in turn (`short` and None: 100,000 each);
    `hold_s`: the policy's hold, None for its default; `policy`: which of the registry's; `quota`: each of the four
    tenants' GPUs, an eighth of the cluster's where None; `backoff`: the policy's `hold_backoff_s`)."""
    oracle, models = from_modeler(MODELER)
    quotas = {f"t{i}": nodes * 8 // 8 if quota is None else quota for i in range(4)}
    core = make_policy(policy, oracle=oracle, models=models, quotas=quotas, hold_s=hold_s, hold_backoff_s=backoff)
    rng = random.Random(seed)
    out: list[bytes] = []
    clock = {"t": 0.0, "n": 0}

    def feed(subject: str, payload, dt: float = 0.0) -> None:
        clock["t"] += dt
        clock["n"] += 1
        e = make(subject, payload, time=clock["t"], id=f"m-{clock['n']}", source="test")
        answers = core.handle(e)
        out.extend(encode(a) for a in answers)
        for a in answers:  # the agents answer every decision at once
            if a.base != "plan.decided":
                continue
            for d in a.payload.decisions:
                st = core.state.jobs.get(d.job_id)
                if st is None:
                    continue
                if d.allocation and st.status != "running":
                    feed(f"job.started.{d.allocation[0].node}",
                         JobStarted(job_id=d.job_id, allocation=d.allocation, plan=d.plan))
                elif d.allocation:
                    feed(f"job.reconfigured.{d.allocation[0].node}",
                         JobReconfigured(job_id=d.job_id, allocation=d.allocation, plan=d.plan, restart_cost_s=78.0))
                elif st.status == "running" and st.allocation:
                    feed(f"job.preempted.{st.allocation[0].node}",
                         JobPreempted(job_id=d.job_id, reason="withdrawn", iterations_done=0))

    for i in range(nodes):
        feed("node.registered", node(f"n{i:02d}", cpus=cpus, mem_gb=mem_gb))
    feed("clock.tick", ClockTick(seq=0, period_s=60.0))
    count = 0

    def submit() -> None:
        nonlocal count
        model, gpus, plan = rng.choice(KINDS)
        count += 1
        iters = (30, 100, 10**5)[count % 3] if short else lengths[count % len(lengths)] if lengths else 10**5
        feed("job.submitted", job(f"j{count:03d}", model, models[model].spec.global_batch_size, plan, gpus,
                                  guaranteed=count % 3 == 0, tenant=f"t{count % 4}", iters=iters), dt=1.0)

    for _ in range(jobs):
        submit()
    for step in range(1, steps + 1):
        running = sorted(j.job_id for j in core.state.jobs_in("running"))
        if running and step % 2:
            victim = rng.choice(running)
            where = core.state.jobs[victim].allocation[0].node
            feed(f"job.completed.{where}", JobCompleted(job_id=victim, iterations=10**5), dt=5.0)
        elif running:
            victim = rng.choice(running)
            where = core.state.jobs[victim].allocation[0].node
            feed(f"job.preempted.{where}", JobPreempted(job_id=victim, reason="node drained", iterations_done=10),
                 dt=5.0)
        submit()
        queued = sorted(j.job_id for j in core.state.jobs_in("queued"))
        if owners and queued and step % 4 == 3:  # an owner takes a waiting job back: its pending reason leaves with it
            feed("job.cancel" if step % 8 == 3 else "job.suspend", JobControl(job_id=rng.choice(queued)), dt=1.0)
        if owners and step == steps // 3:  # every node lost, a round with none, then all back
            for i in range(nodes):
                feed("node.lost", NodeLost(node=f"n{i:02d}", reason="power"), dt=1.0)
            submit()
            for i in range(nodes):
                feed("node.registered", node(f"n{i:02d}", cpus=cpus, mem_gb=mem_gb), dt=1.0)
        if step % 5 == 0:  # measured iterations slower than predicted: the oracle trusts its predictions less
            for job_id in running[:6]:
                st = core.state.jobs.get(job_id)
                if st is None or st.status != "running" or not st.decided_allocation or st.predicted_throughput <= 0:
                    continue
                feed(f"metrics.iteration.{st.decided_allocation[0].node}", MetricsIteration(
                    job_id=job_id, model_type=st.model_type, iteration=step, plan=st.decided_plan,
                    iter_time_s=2.0 * st.global_batch_size / st.predicted_throughput,
                    gpus_per_node=tuple(x.gpus for x in st.decided_allocation), node=st.decided_allocation[0].node))
        if step == steps // 2:  # a refit of one type: its curves, and every job of it, are worked out again
            params = dict(MODELER.types["gpt2"].params.as_dict())
            params["k_bwd"] *= 1.2
            feed("model.updated", ModelUpdated(model_type="gpt2", version=2, params=params, n_points=12, rmsle=0.05))
        feed("clock.tick", ClockTick(seq=step, period_s=60.0), dt=30.0)  # holds end as the run goes on
    return out, core


@pytest.mark.parametrize("seed", [1, 2])
def test_the_memos_change_no_decision(monkeypatch, seed):
    calls = {"candidates": 0, "held": 0, "orders": 0, "reused": 0, "asleep": 0, "attempts": 0, "left_out": 0,
             "stale": 0, "carried": 0, "tables": 0, "quota_kept": 0, "keys_kept": 0, "quota_asleep": 0,
             "quota_woken": 0, "tried_asleep": 0, "carried_guarantees": 0, "finish_kept": 0, "running_left_out": 0,
             "meets_kept": 0, "answered": 0, "quiet_kept": 0}
    real_candidates = engine_mod.RubickEngine._candidates
    real_lowest = engine_mod.RubickEngine._lowest_slope_over_min
    real_order = engine_mod.RubickEngine._node_order
    real_prepare = engine_mod.RubickEngine._prepare
    real_list = engine_mod.RubickEngine._list_sleepers
    real_attempt = engine_mod.RubickEngine._schedule_job

    def listed(self, fell_asleep, asleep):
        real_list(self, fell_asleep, asleep)
        calls["asleep"] += asleep
        calls["quota_asleep"] += len(self._quota_sleepers)  # guarantees outside their quota, kept asleep
        calls["stale"] += sum(not self._current(k, self._round_no) for k in self._sleepers)

    def attempt(self, job, jr=None, only=None):
        calls["attempts"] += 1
        return real_attempt(self, job, jr, only)

    real_tables = engine_mod.RubickEngine._tables
    real_priv = engine_mod.RubickEngine._privileged

    def tables(self, job):
        memo = job.tables_memo
        calls["tables"] += (memo is not None and memo[0] is job.version and memo[1] == job.cpg and memo[2] == job.ref
                            and (job.want_g, job.min_g) in memo[3])  # taken from the record's memo
        return real_tables(self, job)

    real_keep = engine_mod.RubickEngine._keep_guarantees

    def keep(self):
        checked = {j.id: j.meets_memo for j in self._awake}
        kept = real_keep(self)
        calls["meets_kept"] += sum(1 for j in self._awake if j.privileged and checked.get(j.id) is not None
                                   and j.meets_memo is checked[j.id])  # its guarantee found kept as last round
        return kept

    def privileged(self, used, retry):
        before = {j.id: j.quota_detail for j in self._awake}
        asleep = len(self._quota_sleepers)
        woken = real_priv(self, used, retry)  # a guaranteed job outside its quota given the detail it was given last
        calls["quota_kept"] += sum(1 for j in before if before[j] is not None and self.jobs[j].detail is before[j])
        calls["quota_woken"] += asleep - len(self._quota_sleepers)  # woken: it might be placed in its quota now
        return woken

    real_sort = engine_mod.RubickEngine._sort_by_slope

    def sort(self):
        calls["keys_kept"] += sum(1 for j in self._awake if j.carried and not j.touched)  # queue keys kept
        return real_sort(self)

    real_changed = engine_mod.RubickEngine.schedule_changed

    def changed(self, nodes, jobs, touched=None):
        finished.clear()
        outcomes = real_changed(self, nodes, jobs, touched)
        calls["quiet_kept"] += sum(1 for j in self._awake if j.g and j.id not in finished)  # not finished: as it was
        calls["left_out"] += len(jobs) - len(outcomes)
        given = {o.job_id for o in outcomes}
        calls["running_left_out"] += sum(1 for j in self._awake if j.g and j.id not in given)  # the same as last
        calls["tried_asleep"] += len(self._woken) - len(self._woken_last)  # tried, failed: asleep on, not looked at
        calls["answered"] += sum(j.answered == self._round_no for j in self._woken)  # as the round's failed ones were
        return outcomes

    def prepared(self, inp, memo=None, record=None):
        calls["reused"] += record is not None  # the job's record of the last round, made again in place
        job = real_prepare(self, inp, memo, record)
        calls["carried"] += job.carried  # or carried over as it was
        calls["carried_guarantees"] += job.carried and inp.guaranteed  # a running guarantee among them
        return job

    def ordered(self, job, memo=None):
        calls["orders"] += memo is None  # an order worked out, not read from the memo
        return real_order(self, job, memo)

    def counted(self, node):
        calls["candidates"] += 1
        return real_candidates(self, node)

    def watched(self, node, job, limit, memo=None, live=None):
        before = self._skipped_held
        self._skipped_held = False
        try:
            return real_lowest(self, node, job, limit, memo, live)
        finally:
            calls["held"] += self._skipped_held
            self._skipped_held = self._skipped_held or before

    real_finish, real_outcome = engine_mod.RubickEngine._finish, engine_mod.RubickEngine._outcome
    made = []

    finished = set()

    def finish(self, job):
        finished.add(job.id)
        made.append(False)
        out = real_finish(self, job)
        remade = made.pop()
        calls["finish_kept"] += bool(job.g > 0 and out.shares and not remade)  # its last outcome, not made again
        return out

    def outcome(self, job, plan, tput, best):
        made[-1] = True
        return real_outcome(self, job, plan, tput, best)

    monkeypatch.setattr(engine_mod.RubickEngine, "_finish", finish)
    monkeypatch.setattr(engine_mod.RubickEngine, "_outcome", outcome)
    monkeypatch.setattr(engine_mod.RubickEngine, "_candidates", counted)
    monkeypatch.setattr(engine_mod.RubickEngine, "_lowest_slope_over_min", watched)
    monkeypatch.setattr(engine_mod.RubickEngine, "_node_order", ordered)
    monkeypatch.setattr(engine_mod.RubickEngine, "_prepare", prepared)
    monkeypatch.setattr(engine_mod.RubickEngine, "_list_sleepers", listed)
    monkeypatch.setattr(engine_mod.RubickEngine, "_schedule_job", attempt)
    monkeypatch.setattr(engine_mod.RubickEngine, "schedule_changed", changed)
    monkeypatch.setattr(engine_mod.RubickEngine, "_tables", tables)
    monkeypatch.setattr(engine_mod.RubickEngine, "_privileged", privileged)
    monkeypatch.setattr(engine_mod.RubickEngine, "_keep_guarantees", keep)
    monkeypatch.setattr(engine_mod.RubickEngine, "_sort_by_slope", sort)
    resting_unread(monkeypatch, calls)  # the dormant jobs' inputs resting are not read before they are asked for
    with_memos, core = drive(seed, owners=True)
    memo_calls, held, orders, attempts = calls["candidates"], calls["held"], calls["orders"], calls["attempts"]

    def no_memo(self, node, job, limit, memo=None, live=None):
        return watched(self, node, job, limit, None, None)

    monkeypatch.setattr(engine_mod.RubickEngine, "_lowest_slope_over_min", no_memo)
    monkeypatch.setattr(engine_mod.RubickEngine, "_repeat_key", lambda self, job: None)
    monkeypatch.setattr(engine_mod.RubickEngine, "_node_order", lambda self, job, memo=None: ordered(self, job))
    monkeypatch.setattr(engine_mod.RubickEngine, "_prepare",  # every record new, nothing from the last round
                        lambda self, inp, memo=None, record=None: real_prepare(self, inp))
    monkeypatch.setattr(engine_mod.RubickEngine, "_asleep", lambda self, job: False)
    monkeypatch.setattr(engine_mod.RubickEngine, "waiting_clock", True)  # every input brought forward
    monkeypatch.setattr(engine_mod.RubickEngine, "schedule_changed", None)  # every job's outcome, every round
    monkeypatch.setattr(engine_mod.RubickEngine, "_tables",  # every slope table from the book
                        lambda self, job: (setattr(job, "tables_memo", None), real_tables(self, job))[1])
    calls["candidates"] = calls["orders"] = calls["attempts"] = 0
    without, _ = drive(seed, owners=True)

    decided = [b for b in with_memos if b"plan.decided" in b]
    assert len(decided) >= 10 and any(j.status == "queued" for j in core.state.jobs.values())
    assert held > 0  # searches passed over jobs held by their hold: the memo kept what it read of them
    assert memo_calls < calls["candidates"]  # and later searches in the round read it from the memo
    assert orders < calls["orders"]  # as they read the order of the nodes to visit
    assert calls["reused"] > 100  # and rounds made the last round's records again
    assert calls["carried"] > 100  # or carried running jobs' records over as the last round left them
    assert calls["carried_guarantees"] > 10  # guarantees among them, their minimum and flag made again
    assert calls["asleep"] > 100  # or kept waiting jobs' records as they were, asleep
    assert calls["stale"] > 10  # the keys of sleepers awake again or gone were left in the list, passed over
    assert attempts < calls["attempts"]  # and passed over sleepers whose attempts would have failed at once
    assert calls["left_out"] > 100  # and gave no outcome for them: the service kept their last ones
    assert calls["tables"] > 100  # records took their slope tables from their own memo
    assert calls["quota_kept"] > 10  # and guaranteed jobs outside their quota the detail they were last given
    assert calls["quota_asleep"] > 100  # or were kept asleep as they were
    assert calls["quota_woken"] > 0  # until their quota, or the clock, might make them otherwise
    assert calls["tried_asleep"] > 100  # sleepers whose attempt failed slept on, not looked at the next round
    assert calls["answered"] > 100  # most answered from the round's failed attempts, their outcomes not made again
    assert calls["keys_kept"] > 100  # and carried records their keys in the queue
    assert calls["finish_kept"] + calls["quiet_kept"] > 100  # and their last outcomes, not made again
    assert calls["quiet_kept"] > 50  # most not even finished: carried over as they were when last finished
    assert calls["meets_kept"] > 10  # and running guarantees carried over whether they keep their guarantee
    assert calls["running_left_out"] > 100  # which the round left out: the service has them
    assert calls["rested"] > 100  # the inputs of dormant jobs rested, not brought forward
    assert calls["brought"] > 0  # until the engine asked for them
    assert with_memos == without


@pytest.mark.parametrize("backoff", [0.0, 3600.0, 200.0])
def test_a_dormant_jobs_input_rests_only_while_its_hold_surely_lasts(monkeypatch, backoff):
    """The input of a running job the engine keeps dormant is not brought forward while its hold surely lasts
    (`PolicyCore._resting`): at every round, each resting job is held at the round's time as its changes say (the
    seconds since its last change under `rest_hold` of its changes within the back-off window, the promise the engine
    leaves their clock fields unread by), and the engine reads none of them before it asks (they are made unreadable).
    With a back-off window, jobs changed again and again rest past the plain hold. The core publishes the bytes a core
    whose inputs never rest publishes."""
    from policy.service import PolicyCore

    seen = Counter()
    real_listed = PolicyCore._listed_inputs

    def listed(self, t):
        out = real_listed(self, t)
        engine, window = self.engine, self.engine.hold_backoff_s
        for job_id in self._resting:
            since = t - self.changed_at[job_id]
            recent = len([x for x in self.changes.get(job_id, ()) if t - x < window]) if window > 0 else 0
            assert since < engine.rest_hold(recent), (job_id, t)  # held, as the engine is promised
            seen["past_plain"] += since >= engine.rest_hold(0)  # held only by its back-off
        seen["rounds"] += bool(self._resting)
        return out

    monkeypatch.setattr(PolicyCore, "_listed_inputs", listed)
    resting_unread(monkeypatch, seen)
    rested, _ = drive(3, owners=True, steps=60, backoff=backoff)
    assert seen["rounds"] > 20 and seen["rested"] > 100 and seen["brought"] > 0
    assert seen["past_plain"] > 0 if backoff else seen["past_plain"] == 0
    monkeypatch.setattr(PolicyCore, "_rest", lambda self, t: None)  # no input rests
    plain, _ = drive(3, owners=True, steps=60, backoff=backoff)
    assert rested == plain


def _qualifies(engine, job) -> bool:
    """`_fall_dormant`'s test of a record, written out: it may be left dormant by the next round."""
    return bool(job.carried and not job.touched and job.g and job.g >= job.min_g and job.id in engine.held
                and not job.inp.guaranteed and not job.privileged and not job.forced and not job.reason
                and not job.detail and job.whole and job.placed is not None and job.current_rows is not None
                and job.version is not None)


def _stays(engine, job_id, job, ids, jobs, hold, resting) -> bool:
    """`_keep_dormant`'s test of every part of a dormant record, written out (a resting input is held, as promised)."""
    inp, key, index = job.inp, job.index_key, engine._index_base
    return (job_id not in ids and jobs.get(job_id) is inp and inp.running and bool(inp.current)
            and engine._version(inp.kind) is job.version
            and (job_id in resting or inp.changed_s < hold * engine._backoff(inp))
            and job.current_rows[0] is inp.current and job.current_rows[1] is inp.current_mem
            and engine._place_base.rows.get(job_id) is job.current_rows[2]
            and (index.dkey.get(job_id) is key and job_id in index.held if key is not None
                 else job_id not in index.dkey))


@pytest.mark.parametrize("seed", [1, 2])
def test_the_dormant_records_kept_and_made_are_those_a_look_at_every_part_finds(monkeypatch, seed):
    """`_keep_dormant` looks only at whether a round was told of a record dormant through the last round whose input
    rests (no model refitted), and `_fall_dormant` only at the dormant records the round finished and the jobs awake.
    At every round of a busy drive (holds with a back-off, completions, preemptions, every node lost for a while, a
    refit), the records they keep and make dormant are those a look at every part of every record finds."""
    real_keep, real_fall = engine_mod.RubickEngine._keep_dormant, engine_mod.RubickEngine._fall_dormant
    seen = Counter()

    def keep(self, ids, jobs, hold, refitted):
        before = dict(getattr(self, "_dormant", None) or {})
        told = set(ids) | set(getattr(self, "_roused", ()))
        if before and self._place_base is not None and self._index_base is not None:
            resting = set(self.resting)
            expect = {j for j, job in before.items() if _stays(self, j, job, told, jobs, hold, resting)}
            seen["quick"] += sum(1 for j in before if j in resting and j not in told and not refitted
                                 and j not in self._fresh_dormant)
        else:
            expect = set()
        real_keep(self, ids, jobs, hold, refitted)
        assert set(self._dormant) == expect
        seen["kept"] += len(expect)

    def fall(self):
        candidates = [*self._awake, *self._dormant.values()]
        real_fall(self)
        assert set(self._dormant) == {job.id for job in candidates if _qualifies(self, job)}
        seen["finished"] += len(self._finished_dormant)

    monkeypatch.setattr(engine_mod.RubickEngine, "_keep_dormant", keep)
    monkeypatch.setattr(engine_mod.RubickEngine, "_fall_dormant", fall)
    resting_unread(monkeypatch, seen)
    drive(seed, owners=True, steps=60, backoff=3600.0)
    assert seen["kept"] > 200 and seen["quick"] > 100 and seen["finished"] > 0, seen


@pytest.mark.parametrize("seed", [1, 2])
def test_whether_a_guarantee_keeps_with_a_gpu_less_is_shared_only_where_it_is_the_same(monkeypatch, seed):
    """`_keeps_guarantee` keeps its answers for the round under what they depend on, shared by the jobs they are the
    same for: every answer, read back or worked out, is the one a memo of its own gives, and answers worked out for
    one job are read back for others. The placement with a GPU less it keys them on (kept by placement and count,
    `_LESS_ONE`) and the CPUs per GPU are those the plain reading gives. Each job with a request is asked again as three others of its kind and
    reference whose requests differ: at its request's speed, placed on the placement asked about (which then covers
    it) and on one no placement covers; and on the placement asked about at a million times that speed. The drive's
    jobs of one kind and reference all ask the same request, so without these no answer would depend on where a
    request is placed or how fast it runs."""
    real = engine_mod.RubickEngine._keeps_guarantee
    seen = {"asked": 0, "shared": 0, "placed_apart": 0, "faster": 0, "less_one_kept": 0}
    owner: dict = {}
    monkeypatch.setattr(engine_index, "_LESS_ONE", {})  # made in this drive, then read back in it

    def alone_and_shared(self, v, node):
        memo = self._guarantee_memo
        self._guarantee_memo = {}
        kept = (tuple(v.g_on.values()), v.g_on.get(node)) in engine_index._LESS_ONE
        alone = real(self, v, node)  # nothing read back: worked out for this job alone
        (key, _), = self._guarantee_memo.items()
        self._guarantee_memo = memo
        # the placement with a GPU less and the CPUs per GPU in the key, read back or not, are the plain reading's
        assert key[1] == canonical(tuple([g - 1 if n == node else g for n, g in v.g_on.items()])), (v.g_on, node)
        assert key[2] == self.book._cpg(v.inp.kind, self._cpg_of(v))
        seen["less_one_kept"] += kept
        seen["asked"] += 1
        seen["shared"] += key in memo and owner.get(key) not in (None, v.id)
        if key not in memo:
            owner[key] = v.id
        answer = real(self, v, node)
        assert answer == alone, (v.id, node, v.request)
        return answer

    def checked(self, v, node):
        answer = alone_and_shared(self, v, node)
        if v.request is not None:
            place = canonical(tuple([g - 1 if n == node else g for n, g in v.g_on.items()]))
            answers = []
            for where, speed in ((place, v.request.throughput), ((10**6,), v.request.throughput),
                                 (place, v.request.throughput * 1e6)):
                other = copy.copy(v)
                other.request = Best(speed, v.request.plan, where)
                answers.append(alone_and_shared(self, other, node))
            seen["placed_apart"] += answers[0] != answers[1]
            seen["faster"] += answers[0] != answers[2]
        return answer

    monkeypatch.setattr(engine_mod.RubickEngine, "_keeps_guarantee", checked)
    drive(seed, jobs=120, steps=20)
    assert seen["asked"] > 100 and seen["shared"] > 0 and seen["placed_apart"] > 0 and seen["faster"] > 0, seen
    assert seen["less_one_kept"] > 50, seen


@pytest.mark.parametrize("seed", [1, 3])
def test_a_kept_attempt_leaves_no_stale_node_in_the_memo(monkeypatch, seed):
    """After every kept attempt of the queue, what the memo still holds of each node is what reading the node
    again gives (the nodes it changed were dropped, the others are as they were)."""
    real_forget = engine_mod.RubickEngine._forget
    seen = {"checked": 0, "dropped": 0}

    def checked(self, jr, mark):
        before = set(self._scans)
        real_forget(self, jr, mark)
        seen["dropped"] += len(before - set(self._scans))
        for node, (entries, lowest) in self._scans.items():
            fresh = self._candidates(node)
            assert [e[:5] + e[6:] for e in entries] == [e[:5] + e[6:] for e in fresh], node
            for e, f in zip(entries, fresh):
                if e[5] is not None:
                    v = f[4]
                    assert e[5] == (self._over_min(v) and not (v.privileged and not self._keeps_guarantee(v, node)))
            if lowest is not None:
                assert lowest == self._lowest_of(node, fresh)
            seen["checked"] += 1

    monkeypatch.setattr(engine_mod.RubickEngine, "_forget", checked)
    # few CPUs: ZeRO-Offload jobs take them from others; short holds: few held jobs, whose nodes a search that passed
    # over one passes without reading (`_none_below`), so the searches read many nodes into the memo
    drive(seed, nodes=16, jobs=160, steps=30, cpus=12, hold_s=10.0)
    # (growths that shrink no job are read without their search, `_takes_free_only`: about a hundred nodes a drive)
    assert seen["checked"] > 50 and seen["dropped"] > 10, seen


@pytest.mark.parametrize("seed", [1, 3])
def test_the_nodes_a_job_may_shrink_are_those_its_prefix_holds(monkeypatch, seed):
    """The nodes a growing job may shrink (`_shrinkable`), and for a long prefix those read from the lowest keys
    listed under each node (`_shrinkable_listed`, run here for every prefix), are the nodes where the prefix's jobs
    hold GPUs, as reading the jobs themselves gives, by name, with their indices among the nodes by name, also where
    `_shrinkable_listed` answers from what it kept of an earlier call; the arrays of the lowest keys are those the
    lists give, and the lists of the keys of jobs not held those of `_node_keys` less the held jobs' keys. Every
    prefix kept says of each node whether its lowest key listed is at or below the prefix's last key, also after a
    lowest key changed since it was worked out (its entries are written again, `_low_changed`)."""
    real = engine_mod.RubickEngine._shrinkable
    real_low = engine_mod.RubickEngine._low_changed
    seen = {"calls": 0, "nodes": 0, "ties": 0, "held": 0, "kept": 0, "rewritten": 0, "prefixes": 0}

    def low_changed(self, node, keys, p, s, o):
        seen["rewritten"] += o is not None and bool(self._within)  # a lowest key changed under kept prefixes
        return real_low(self, node, keys, p, s, o)

    def checked(self, end, mine):
        jobs = self.jobs
        held = sorted(set().union(*(jobs[k[3]].g_on for k in self.by_down[:end])) - mine)
        for node, i in self._nidx.items():
            keys = self._node_keys[node]
            assert (self._lo_p[i], self._lo_s[i], self._lo_o[i]) == (keys[0][:3] if keys else (math.inf,) * 3)
            unheld = [k for k in keys if k[3] not in self.held]
            assert self._unheld_keys.get(node, []) == unheld
            assert (self._un_p[i], self._un_s[i]) == ((unheld[0][0], unheld[0][1]) if unheld else (math.inf, math.inf))
            seen["held"] += len(keys) - len(unheld)
        bound = self.by_down[end - 1]
        seen["ties"] += sum(1 for keys in self._node_keys.values() if keys and keys[0][:2] == bound[:2])
        seen["kept"] += bound in self._within  # worked out by an earlier call of the round
        lows = [self._node_keys[name] for name in self._by_name]
        for last, within in self._within.items():
            assert within.tolist() == [bool(keys) and keys[0] <= last for keys in lows]
            seen["prefixes"] += 1
        for names, idx in (real(self, end, mine), self._shrinkable_listed(end, mine)):
            assert names == held
            assert [self._by_name[i] for i in idx] == held
        seen["calls"] += 1
        seen["nodes"] += len(held)
        return real(self, end, mine)

    monkeypatch.setattr(engine_mod.RubickEngine, "_shrinkable", checked)
    monkeypatch.setattr(engine_mod.RubickEngine, "_low_changed", low_changed)
    drive(seed, nodes=16, jobs=160, steps=30, cpus=12)
    assert seen["calls"] > 50 and seen["nodes"] > 50 and seen["ties"] > 0 and seen["held"] > 50, seen
    assert seen["kept"] > 10 and seen["rewritten"] > 10 and seen["prefixes"] > 50, seen


@pytest.mark.parametrize("seed,skip_from", [(1, 0), (2, 0), (1, 10**9), (2, 10**9)])
def test_a_walk_passes_only_nodes_where_the_search_does_nothing(monkeypatch, seed, skip_from):
    """An attempt's walk (`_visits`) works out the nodes of the jobs it may shrink only when the search reaches them,
    and they are those the order would have held had they been worked out as the attempt began; of them it passes
    the nodes where its search would do nothing (for every tail however short, and for a short one once the search
    passed over a held job). The events are those of a core that visits every node, and on each node passed the
    search would have found no job to shrink (`_none_below` says so, with the same victims) and no free GPU."""
    real_visits = engine_mod.RubickEngine._visits
    seen = {"walks": 0, "passed": 0, "tails": 0, "lazy": 0}

    def visits(self, job, order, victims):
        head = list(order.head())
        if order.end and order.tail is None:
            eager = self._shrinkable(order.end, order.seen())[0]  # the tail as the attempt began
        else:
            eager = order.tail or []
        full, last, target = head + eager, -1, max(job.want_g, job.min_g)
        for node in real_visits(self, job, order, victims):
            at = full.index(node)
            if at >= len(head):
                assert order.tail == eager  # worked out now, the same nodes as at the start
                seen["lazy"] += 1
            for k in range(last + 1, at):  # the nodes passed, in the state the search would have read them
                passed = full[k]
                assert k >= len(head) and self.free_g[passed] == 0
                assert job.g >= job.min_g and self._none_below(passed, job, victims)
                seen["passed"] += 1
            last = at
            yield node
        for k in range(last + 1, len(full)):
            if job.g < target:  # the search would have gone on to it
                assert k >= len(head) and self.free_g[full[k]] == 0 and self._none_below(full[k], job, victims)
                seen["passed"] += 1
        seen["walks"] += 1
        seen["tails"] += bool(order.end)

    def every_node(self, job, order, victims):
        yield from order.head()
        if order.end:
            yield from self._shrinkable(order.end, order.seen())[0]

    monkeypatch.setattr(engine_index, "_SKIP_FROM", skip_from)
    monkeypatch.setattr(engine_mod.RubickEngine, "_visits", visits)
    skipping, _ = drive(seed, nodes=16, jobs=160, steps=30)
    assert seen["walks"] > 50 and seen["passed"] > 100 and seen["tails"] > 50 and seen["lazy"] > 50, seen
    monkeypatch.setattr(engine_mod.RubickEngine, "_visits", every_node)
    every, _ = drive(seed, nodes=16, jobs=160, steps=30)
    assert skipping == every


def _settles_refused(engine, job, old, restarts=1) -> None:
    """Settle the job's allocation as it is after all: it succeeds, takes CPUs from no job, and the restart rule
    refuses the change at `restarts` restarts (`_worth_it`'s, for a change that shrinks `restarts - 1` running jobs);
    then undo it."""
    forced = {j.id: j.forced for j in engine.jobs.values()}
    jr = records._Journal()
    assert engine._settle(jr, job)
    assert job.g >= job.min_g and not engine._worth_it(job, old, {f"v{i}": _RUNNING for i in range(restarts - 1)})
    assert {j.id: j.forced for j in engine.jobs.values()} == forced
    engine._undo(jr, [job])


_RUNNING = SimpleNamespace(inp=SimpleNamespace(running=True))
"""A running job as `_worth_it` counts the jobs a change shrinks."""


@pytest.mark.parametrize("seed,mem_gb,shows", [(1, 1600.0, "settled"), (2, 20.0, "not")])
def test_an_attempt_that_gathers_nothing_is_refused_without_settling(monkeypatch, seed, mem_gb, shows):
    """An attempt of a running job that finds no GPU to add (nothing free, no job below it) is answered by
    `_settled` without `_settle`: each time it says the change would be refused, settling the allocation as it is
    succeeds, takes nothing from another job, and ends on a plan the restart rule refuses; the events published
    are those of a core that settles every attempt and searches every node. With 20 GB a node, some plans' host
    memory does not fit where the job runs, and `_settled` answers no (`shows`: the answer each case must give at
    least once)."""
    real = engine_mod.RubickEngine._settled
    seen = {"settled": 0, "not": 0}

    def checked(self, job, old, shape=None, g_on=None, restarts=1):
        answer = real(self, job, old, shape, g_on, restarts)
        if g_on is not None:  # after free GPUs taken (`_settles_back`, the test below), or a search (`_refused_on`)
            return answer
        seen["settled" if answer else "not"] += 1
        if answer:
            _settles_refused(self, job, old)
        return answer

    monkeypatch.setattr(engine_mod.RubickEngine, "_settled", checked)
    shortcut, core = drive(seed, mem_gb=mem_gb)
    assert seen["settled"] > 50 and seen[shows] > 0, seen

    monkeypatch.setattr(engine_mod.RubickEngine, "_settled",
                        lambda self, job, old, shape=None, g_on=None, restarts=1: False)
    monkeypatch.setattr(engine_mod.RubickEngine, "_may_gather", lambda self, job, floor: True)
    settled_each_time, _ = drive(seed, mem_gb=mem_gb)
    assert sum(b"plan.decided" in b for b in shortcut) >= 10
    assert shortcut == settled_each_time


@pytest.mark.parametrize("seed,mem_gb,lengths,shows", [
    (1, 1600.0, None, "moved"), (4, 20.0, None, "moved"), (5, 1600.0, None, "not"),
    (3, 1600.0, (1000, 3000, 10000), "faster"), (1, 1600.0, (100, 300, 10**5), "faster")])
def test_an_attempt_that_would_give_back_the_free_gpus_it_takes_is_refused_without_them(monkeypatch, seed, mem_gb,
                                                                                       lengths, shows):
    """A running job's attempt whose search would take only free GPUs (`_takes_free_only`) and whose settling would
    end on a plan whose gain does not pay a restart (`_settles_back`) is refused without taking them: each time it
    says so, taking those GPUs (the search itself, on the same order of nodes, takes the same), settling, and
    asking the restart rule does just that, moving no other job. Settling may keep some of the GPUs taken (`_trim`
    breaks ties between nodes by name: `moved`) and end on a plan no faster, or a little faster (`faster`: jobs with
    a few thousand iterations left, whose gain does not pay a restart). The events published are those of a core that
    runs every search. With 20 GB a node, some plans' host memory does not fit where the job runs. `shows`: what each
    case must show at least once (`not`: an attempt `_settles_back` leaves to the search). Every case passes over
    nodes where only held jobs are below the growing one (`passed`): the reading sets the flags the search sets; and
    every case reads on past the free nodes, to the nodes of the jobs the growing one may shrink (`tail`)."""
    real_takes, real_back = engine_mod.RubickEngine._takes_free_only, engine_mod.RubickEngine._settles_back
    seen = {"back": 0, "not": 0, "none": 0, "moved": 0, "faster": 0, "passed": 0, "tail": 0}

    def takes(self, job, order, floor, target):
        flags = (self.held_back, self._skipped_held)
        taken, stop = real_takes(self, job, order, floor, target)
        seen["none"] += stop is not None
        # the search itself on the same nodes, from the flags as they were: the same GPUs, from no other job, and
        # the held jobs it passes over setting the flags the reading set; where the reading stopped (`stop`), the
        # search finds there the first job it would shrink, with the free GPUs read taken on its way
        seen["tail"] += order.end and sum(taken.values()) < target - job.g  # the reading went on to the tail
        read = (self.held_back, self._skipped_held)
        self.held_back, self._skipped_held = flags
        start, g_on = dict(job.g_on), dict(job.g_on)
        jr, victims, found = records._Journal(), {}, None
        for node in self._visits(job, order, victims):
            if target - job.g <= 0:
                break
            take = min(self.free_g[node], target - job.g)
            if take > 0:
                self._move(jr, node, None, job, take)
            others = self.on_node[node]
            if not others or (len(others) == 1 and job.id in others):
                continue
            assert job.g >= job.min_g
            if target - job.g <= 0 or not self._beats(job, floor) or self._none_below(node, job, victims):
                continue  # (the search looks for a job to shrink only while it wants more)
            if self._lowest_slope_over_min(node, job, job.up()) is not None:
                found = node  # the search shrinks a job here
                break
            seen["passed"] += 1  # only held jobs below it here
        assert found == stop
        for node, take in taken.items():
            g_on[node] = g_on.get(node, 0) + take
        assert job.g_on == g_on and (self.held_back, self._skipped_held) == read
        self._undo(jr, [job])
        assert job.g_on == start
        return taken, stop

    def back(self, job, taken, old):
        answer = real_back(self, job, taken, old)
        seen["back" if answer else "not"] += 1
        if answer:
            forced = {j.id: j.forced for j in self.jobs.values()}
            start, jr = dict(job.g_on), records._Journal()
            for node, take in taken.items():
                self._move(jr, node, None, job, take)
            assert self._settle(jr, job)
            seen["moved"] += job.g_on != start
            seen["faster"] += job.best.throughput > old.throughput * (1 + 1e-9)
            assert job.g >= job.min_g and not self._worth_it(job, old, {})
            assert {j.id: j.forced for j in self.jobs.values()} == forced
            self._undo(jr, [job])
        return answer

    monkeypatch.setattr(engine_mod.RubickEngine, "_takes_free_only", takes)
    monkeypatch.setattr(engine_mod.RubickEngine, "_settles_back", back)
    # room to spare: jobs grow onto free GPUs
    shortcut, _ = drive(seed, nodes=48, jobs=60, mem_gb=mem_gb, lengths=lengths)
    assert seen["back"] > 3 and seen["none"] > 5 and seen["passed"] > 0 and seen["tail"] > 0 and seen[shows] > 0, seen

    # no reading: every search runs from its first node
    monkeypatch.setattr(engine_mod.RubickEngine, "_takes_free_only", lambda self, job, order, floor, target: ({}, None))
    searched_each_time, _ = drive(seed, nodes=48, jobs=60, mem_gb=mem_gb, lengths=lengths)
    assert sum(b"plan.decided" in b for b in shortcut) >= 10
    assert shortcut == searched_each_time


def _free_over_every_job(core) -> int:
    """The live nodes' GPUs less those decided to every open job on them, counted afresh."""
    alive = {n.node: n.gpus for n in core.state.alive_nodes()}
    return sum(alive.values()) - sum(s.gpus for j in core.state.jobs.values()
                                     if j.status in ("queued", "running", "preempted")
                                     for s in j.decided_allocation if s.node in alive)


@pytest.mark.parametrize("seed, owners", [(1, False), (2, False), (3, True)])
def test_the_free_gpus_kept_between_events_are_those_counted_again(monkeypatch, seed, owners):
    """A submission that may wait for the next round asks how many GPUs no decision holds (`_free_gpus`); the
    count is kept until an event that may change it, and made over the jobs whose last decision gave them GPUs,
    counting again only those touched since the last count (`_count_free`). Each time it is asked, it equals a
    count made then over every open job (seed 3: with jobs cancelled and suspended, and every node lost for a
    while)."""
    from policy import service as service_mod
    real = service_mod.PolicyCore._free_gpus
    seen = {"asked": 0, "kept": 0, "recounted": 0}

    def checked(self):
        seen["kept"] += self._free is not None
        seen["recounted"] += self._free is None and self._recount is not None and self._used_alive is not None
        got = real(self)
        assert got == self._count_free() == _free_over_every_job(self)
        seen["asked"] += 1
        return got

    monkeypatch.setattr(service_mod.PolicyCore, "_free_gpus", checked)
    drive(seed, owners=owners)
    assert seen["asked"] > 50 and seen["kept"] > 10 and seen["recounted"] > 10, seen


def test_the_free_gpus_are_counted_over_every_job_after_events_folded_past_the_core():
    """Events folded into a core's state behind its back (as `bench/policy_round.py`'s `whole` runs do) may change
    what any job holds: the next count is made over every job again."""
    _, core = drive(1, steps=10)
    assert core._count_free() == _free_over_every_job(core)
    holding = sorted(j for j in core._holding if core.state.jobs[j].status == "running")
    assert len(holding) >= 2
    t = core.state.time
    for i, job_id in enumerate(holding[:2]):  # folded into the state alone: the core is not told
        core.state.apply(make("job.completed", JobCompleted(job_id=job_id, iterations=10**5), time=t + 1 + i,
                              id=f"past-{i}", source="test"))
    core.handle(make("clock.tick", ClockTick(seq=1, period_s=60.0), time=t + 3, id="after", source="test"))
    assert core._count_free() == _free_over_every_job(core)


def test_the_jobs_to_count_again_are_bounded_where_no_submission_asks():
    """A core whose submissions ask for the free GPUs no more (batching off here, after one count) marks every job an
    event is about to be counted again: past one more than twice the jobs holding GPUs the marks are dropped and every
    job is counted at the next ask, which still gives what a count over every open job does."""
    oracle, models = from_modeler(MODELER)
    core = make_policy("rubick", oracle=oracle, models=models, batch_s=0.0)
    t = 0.0
    for i in range(2):
        t += 1.0
        core.handle(make("node.registered", node(f"n{i}"), time=t, id=f"n-{i}", source="test"))
    assert core._count_free() == 16 and core._recount == set()
    most, dropped = 0, 0
    for i in range(80):
        t += 1.0
        spec = models["vit"].spec
        core.handle(make("job.submitted", job(f"j{i:02d}", "vit", spec.global_batch_size, Plan(dp=1), 1), time=t,
                         id=f"s-{i}", source="test"))
        starting = sorted(j for j in core._holding if core.state.jobs[j].status != "running")
        for job_id in starting:  # the agents start what was decided
            st = core.state.jobs[job_id]
            t += 1.0
            core.handle(make("job.started", JobStarted(job_id=job_id, allocation=st.decided_allocation,
                                                       plan=st.decided_plan), time=t, id=f"st-{job_id}",
                             source="test"))
        if i % 2 and core._holding:  # and one in two ends
            done = min(core._holding)
            t += 1.0
            core.handle(make("job.completed", JobCompleted(job_id=done, iterations=10**5), time=t, id=f"c-{i}",
                             source="test"))
        if core._recount is not None:
            most = max(most, len(core._recount))
            assert len(core._recount) <= 2 * len(core._holding) + 1
        else:
            dropped += 1
    assert most >= 3 and dropped  # marks were gathered, then dropped
    assert core._count_free() == _free_over_every_job(core)


@pytest.mark.parametrize("seed", [1, 4])
def test_the_free_gpus_counted_again_after_every_event_are_those_of_every_job(monkeypatch, seed):
    """`_count_free` asked after every event a core handles (submissions, completions, preemptions, decisions,
    cancellations, suspensions, nodes lost and back) counts again only the jobs touched since it last ran, and equals
    a count over every open job."""
    from policy import service as service_mod
    real = service_mod.PolicyCore._handle
    seen = {"events": 0, "partial": 0}

    def checked(self, event, rounds):
        out = real(self, event, rounds)
        seen["partial"] += self._recount is not None and self._used_alive is self.state.alive_names()
        assert self._count_free() == _free_over_every_job(self), event.subject
        seen["events"] += 1
        return out

    monkeypatch.setattr(service_mod.PolicyCore, "_handle", checked)
    drive(seed, owners=True)
    assert seen["events"] > 200 and seen["partial"] > seen["events"] // 2, seen


@pytest.mark.parametrize("seed, lengths", [(1, None), (2, None), (3, (400, 2000, 10**5))])
def test_the_slope_index_patched_from_the_last_rounds_is_the_one_made_whole(monkeypatch, seed, lengths):
    """A round's slope index is the last round's as that round left it (`_index_base`), its changed jobs taken out and
    put in again (`_patch_base`). After every round's `_index_all` each job's key is the one `_reindex` makes (a
    guarantee kept carried over among them), and the index equals the index made whole from the same keys (every
    node lost and back between, where the layout changes and the index is made whole); the round works on the kept
    index itself, and nothing writes it between the end of one round and the next round's `_index_all`; and the events
    are the bytes of a core that makes it whole every round. Seed 3's shorter jobs bring guarantees kept near their
    deadlines, where whether one keeps its guarantee with a GPU less moves with the clock while it is carried over."""
    import numpy as np
    real = engine_mod.RubickEngine._index_all
    real_round = engine_mod.RubickEngine._round
    seen = {"rounds": 0, "patched": 0, "kept": 0, "dormant": 0, "left": 0}

    def snapshot(base):
        return (base.by_down[:], dict(base.dkey), dict(base.dnodes), {n: ks[:] for n, ks in base.node_keys.items()},
                {n: ks[:] for n, ks in base.unheld_keys.items()}, set(base.held),
                [a.copy() for a in (base.lo_p, base.lo_s, base.lo_o, base.un_p, base.un_s)])

    def round_left(self, *args, **kwargs):
        out = real_round(self, *args, **kwargs)
        base = getattr(self, "_index_base", None)
        seen["snapshot"] = (base, snapshot(base)) if base is not None else None  # the index as the round left it
        if base is not None:  # whole as the round leaves it: what the next round's patch reads of it
            assert base.held <= base.dkey.keys() and sorted(base.dkey.values()) == base.by_down
            for node, i in self._nidx.items():
                keys = base.node_keys.get(node, [])
                assert keys == sorted(k for jid, k in base.dkey.items() if node in base.dnodes[jid])
                unheld = [k for k in keys if k[3] not in base.held]
                assert base.unheld_keys.get(node, []) == unheld
                assert (base.lo_p[i], base.lo_s[i], base.lo_o[i]) == (keys[0][:3] if keys else (math.inf,) * 3)
                assert (base.un_p[i], base.un_s[i]) == (unheld[0][:2] if unheld else (math.inf,) * 2)
        return out

    def checked(self):
        before = getattr(self, "_index_base", None)
        if before is not None and seen.get("snapshot") is not None:  # as the last round left it: nothing wrote it since
            left, kept = seen["snapshot"]
            now = snapshot(before)
            assert left is before
            assert kept[:6] == now[:6] and all(np.array_equal(a, b) for a, b in zip(kept[6], now[6]))
            seen["left"] += 1
        real(self)
        listed_now = (*self._awake, *self._dormant.values())  # the jobs awake, and those left dormant
        seen["dormant"] += len(self._dormant)
        for j in listed_now:  # each key as `_reindex` makes it now (a guarantee kept was flagged before)
            listed = j.g > 0 and self._over_min(j) and (
                not j.privileged or self._keeps_guarantee(j, min(j.g_on, key=lambda n: (j.g_on[n], n))))
            assert self._dkey.get(j.id) == ((j.inp.priority, j.down(), -j.inp.order, j.id) if listed else None)
            seen["kept"] += j.privileged and j.carried
        base = self._index_base
        seen["rounds"] += 1
        seen["patched"] += base is before
        inf = np.full(len(self._nidx), math.inf)
        fresh_arrays = (self._lo_p, self._lo_s, self._lo_o, self._un_p, self._un_s)
        self._lo_p, self._lo_s, self._lo_o, self._un_p, self._un_s = (inf.copy() for _ in range(5))
        fresh = self._base_of([(j, j.index_key) for j in listed_now if j.index_key is not None])
        self._lo_p, self._lo_s, self._lo_o, self._un_p, self._un_s = fresh_arrays
        assert self.by_down == fresh.by_down and self.by_down is base.by_down  # the round works on the kept index
        assert self._listed_held is base.held and base.held == fresh.held
        assert self._dkey == fresh.dkey and self._dnodes == fresh.dnodes
        assert {n: ks for n, ks in self._node_keys.items() if ks} == fresh.node_keys
        assert {n: ks for n, ks in self._unheld_keys.items() if ks} == {n: ks for n, ks in fresh.unheld_keys.items() if ks}
        for mine, made in zip(fresh_arrays, (fresh.lo_p, fresh.lo_s, fresh.lo_o, fresh.un_p, fresh.un_s)):
            assert np.array_equal(mine, made)

    monkeypatch.setattr(engine_mod.RubickEngine, "_index_all", checked)
    monkeypatch.setattr(engine_mod.RubickEngine, "_round", round_left)
    patched, _ = drive(seed, owners=True, lengths=lengths)
    assert seen["patched"] > seen["rounds"] // 2 and seen["rounds"] - seen["patched"] >= 2
    assert seen["left"] > seen["rounds"] // 2, seen
    assert seen["kept"] > 10  # guarantees kept, carried over: their keys made again
    assert seen["dormant"] > 10  # held jobs left dormant: listed as they were
    monkeypatch.setattr(engine_mod.RubickEngine, "_patch_base", lambda self, base, gathered: False)
    whole, _ = drive(seed, owners=True, lengths=lengths)
    assert patched == whole


def test_a_round_between_two_submissions_counts_the_free_gpus_again(monkeypatch):
    """Two best-effort submissions a second apart, nothing from the agents between them: the first finds free
    GPUs and runs a round that places it; the second asks again and sees what the round left."""
    from policy import service as service_mod
    real = service_mod.PolicyCore._free_gpus
    counts: list[int] = []

    def checked(self):
        got = real(self)
        assert got == self._count_free()
        counts.append(got)
        return got

    monkeypatch.setattr(service_mod.PolicyCore, "_free_gpus", checked)
    oracle, models = from_modeler(MODELER)
    core = make_policy("rubick", oracle=oracle, models=models)  # batching on: 60 s
    t = {"now": 0.0}

    def feed(subject: str, payload) -> list:
        t["now"] += 1.0
        return core.handle(make(subject, payload, time=t["now"], id=f"f-{t['now']}", source="test"))

    feed("node.registered", node("n00"))
    feed("clock.tick", ClockTick(seq=0, period_s=60.0))
    first = feed("job.submitted", job("a", "vit", models["vit"].spec.global_batch_size, Plan(dp=1), 1))
    assert any(e.base == "plan.decided" for e in first)  # it found GPUs free and ran a round
    feed("job.submitted", job("b", "vit", models["vit"].spec.global_batch_size, Plan(dp=1), 1))
    held = sum(s.gpus for s in core.state.jobs["a"].decided_allocation)
    assert counts == [8, 8 - held] and held > 0


def test_a_kept_plans_speed_is_asked_again_once_its_model_is_refitted():
    """A running job kept on its plan (a better one would not pay a restart) has that plan's speed asked of the
    oracle once per model version, placement and CPUs, not every round. A refit that makes its plan slow makes the
    next round ask again, and the change pays: the job moves to the better plan."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    kind = engine_mod.JobKind(models["gpt2"], 64)
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0)]
    current = Plan(dp=4, tp=2)
    inp = engine_mod.JobIn("j", "t0", False, kind, 0, 8, 32, current, current={"n0": (8, 32)},
                           current_plan=current, running=True, remaining_iters=20.0)
    (first,) = engine.schedule(nodes, [inp])
    assert first.plan == current and first.shares == {"n0": (8, 32, first.shares["n0"][2])}
    best = engine.book.best(kind, (8,), 4)
    assert best.plan != current  # kept: the better plan would not pay a restart
    (again,) = engine.schedule(nodes, [inp])
    assert again.plan == current
    params = {**oracle.params.get("gpt2", PerfParams()).as_dict(), "k_tp": 1e4}  # TP now costs a fortune
    oracle.update(ModelUpdated(model_type="gpt2", version=99, params=params, n_points=1, rmsle=0.0))
    (after,) = engine.schedule(nodes, [inp])
    assert after.plan is not None and after.plan.tp == 1 and after.plan != current


def test_a_waiting_guarantee_works_its_minimum_out_again_when_its_types_margin_changes():
    """A job handed the same input object as last round (a waiting job nothing happened to) takes what its request
    means from last round after checking its model's version and its type's guarantee margins. Here the oracle's
    margin for gpt2 grows between two rounds (its predictions overshot a measured speed by 40%): the waiting
    guarantee's minimum is worked out again (4 GPUs met its reference by the old margin, only its whole request
    meets it by the new one), and in every round what its request means, and every outcome, are a fresh engine's."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models, quotas={"t0": 2, "t1": 8}).engine
    kind = engine_mod.JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size)
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0)]
    holder = engine_mod.JobIn("holder", "t1", False, kind, 0, 8, 32, Plan(dp=8), current={"n0": (8, 32)},
                              current_plan=Plan(dp=8), running=True, priority=10)
    waiting = engine_mod.JobIn("w", "t0", True, kind, 1, 8, 32, Plan(dp=8, zero_stage=2, offload=True))
    seen = []
    for overshoot in (0.0, 0.4, 0.0):
        oracle.overshoot["gpt2"] = overshoot
        outcomes = engine.schedule(nodes, [holder, waiting])
        fresh = make_policy("rubick", oracle=oracle, models=models, quotas={"t0": 2, "t1": 8}).engine
        facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731
        # by job: the round lists a record kept asleep (a guarantee outside its quota) before those it made
        assert sorted(map(facts, outcomes)) == sorted(map(facts, fresh.schedule(nodes, [holder, waiting])))
        assert engine.jobs["w"].inp is waiting and not engine.jobs["w"].g  # still waiting, over its tenant's quota
        # what its request means, as the round took it: (CPUs per GPU, reference, curve, wanted, minimum GPUs,
        # minimum CPUs, slope tables, the request as a plan)
        demand, expected = engine._prepared["w"][7], fresh._prepared["w"][7]
        assert (demand[:2], demand[3:6], demand[8]) == (expected[:2], expected[3:6], expected[8])
        seen.append(demand[4])
    assert seen == [4, 8, 4]


def _facts(o) -> tuple:
    return o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending


def _as_fresh(engine, oracle, models, nodes, jobs: dict, out: dict) -> None:
    """Every job's outcome of a round (`out`, and the last one of a job it left out) is a fresh engine's, handed every
    input."""
    fresh = make_policy("rubick", oracle=oracle, models=models, quotas=dict(engine.quotas)).engine
    for o in fresh.schedule(nodes, list(jobs.values())):
        assert _facts(out.get(o.job_id, engine.outcome_of(o.job_id))) == _facts(o)


def _quota_sleeper(monkeypatch) -> tuple:
    """(oracle, models, engine, nodes, the input of `w`, the inputs, woken): a waiting guarantee `w` whose minimum is
    over its tenant's quota, beside a running job of another tenant holding a node. `woken` gets, in its last set,
    the jobs `_wake_in_quota` woke (a caller adds a set before each round it counts)."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models, quotas={"t0": 2, "t1": 16}).engine
    kind = engine_mod.JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size)
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0), engine_mod.NodeCap("n1", 8, 96, 1600.0)]
    holder = engine_mod.JobIn("holder", "t1", False, kind, 0, 8, 32, Plan(dp=8), current={"n0": (8, 32)},
                              current_plan=Plan(dp=8), running=True, priority=10, remaining_iters=1e6, changed_s=1e6)
    waiting = engine_mod.JobIn("w", "t0", True, kind, 1, 8, 32, Plan(dp=8, zero_stage=2, offload=True),
                               remaining_iters=1000.0, target_iters=1000.0)
    woken: list[set] = [set()]
    real = engine_mod.RubickEngine._wake_in_quota

    def wake(self, used):
        before = set(self._quota_sleepers)
        out = real(self, used)
        woken[-1] |= before - set(self._quota_sleepers)
        return out

    monkeypatch.setattr(engine_mod.RubickEngine, "_wake_in_quota", wake)
    return oracle, models, engine, nodes, waiting, {"holder": holder, "w": waiting}, woken


def test_a_guarantee_outside_its_quota_sleeps_until_its_quota_margins_or_clock_would_make_it_otherwise(monkeypatch):
    """A waiting guaranteed job its tenant's quota leaves out runs as best-effort; handed the same input, it is kept
    asleep as it was, round after round, and woken as soon as anything it is made of would make it otherwise: its
    type's margin (here the oracle's predictions overshot a measured speed), the clock (its deadline comes so near
    that it may take only its minimum), the quota being taken away or raised (then it is placed within it). Round by
    round, every outcome is a fresh engine's, handed every input."""
    oracle, models, engine, nodes, waiting, jobs, woken = _quota_sleeper(monkeypatch)
    given = []

    def round_of(touched):
        woken.append(set())
        out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, touched)}
        given.append("w" in out)
        _as_fresh(engine, oracle, models, nodes, jobs, out)
        return woken[-1], engine.jobs["w"]

    assert round_of(None)[1].detail == {"quota": "exceeded"}  # its minimum is over the quota: best-effort
    for _ in range(3):
        assert round_of(set()) == (set(), engine.jobs["w"]) and "w" in engine._quota_sleepers  # kept asleep
    assert given[-2:] == [False, False]  # its quota and what is used of it as its last outcome said: left out
    want = engine.jobs["w"].want_g
    oracle.overshoot["gpt2"] = 0.4  # its type's margin grows: its minimum is worked out again
    assert round_of(set())[0] == {"w"}
    oracle.overshoot["gpt2"] = 0.0
    assert round_of(set())[0] == {"w"} and round_of(set())[0] == set()
    waiting.elapsed_s = 1e7  # its deadline has passed: no room to take more than its minimum
    woke, record = round_of(set())
    assert woke == {"w"} and record.want_g < want and round_of(set())[0] == set()
    engine.quotas = {"t0": 0, "t1": 16}  # no quota at all now: it says so
    woke, record = round_of(set())
    assert woke == {"w"} and record.detail == {"quota": "none"}
    engine.quotas = {"t0": 16, "t1": 16}  # room in its quota: placed as a guarantee
    woke, record = round_of(set())
    assert woke == {"w"} and record.privileged and record.g and not engine._quota_sleepers


def test_what_a_guarantee_asleep_outside_its_quota_asks_is_kept_only_while_the_clock_leaves_it_so(monkeypatch):
    """`_wake_in_quota` keeps what a sleeper asks for (`_asks_window`) for the seconds since submission it holds for.
    Walked to the very second its slack runs out (found by bisection on `_asks` itself, to the last bit) and past it,
    the sleeper wakes in the round that `_asks` worked out afresh changes, and in no other; its progress reported
    while it waits (less work left: room again) wakes it at once. Every outcome is a fresh engine's."""
    oracle, models, engine, nodes, waiting, jobs, woken = _quota_sleeper(monkeypatch)

    def round_at(elapsed: float) -> bool:
        """A round with the sleeper `elapsed` s after its submission; whether it woke, checked against `_asks`."""
        waiting.elapsed_s = elapsed
        record = engine.jobs["w"]
        held = engine._prepared["w"]
        asks_now = engine._asks(record, held[7][3], held[7][4])  # afresh, on the record as the last round left it
        should = record.sleeping and asks_now != record.want_g
        woken.append(set())
        out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, set())}
        _as_fresh(engine, oracle, models, nodes, jobs, out)
        woke = "w" in woken[-1]
        assert woke == should, (elapsed, asks_now, record.want_g)
        return woke

    engine.schedule_changed(nodes, jobs, None)
    engine.schedule_changed(nodes, jobs, set())  # found asleep as the round begins
    record = engine.jobs["w"]
    assert record.detail == {"quota": "exceeded"} and "w" in engine._quota_sleepers
    held = engine._prepared["w"]
    want, least = held[7][3], held[7][4]
    assert want > max(1, least) and record.want_g == want  # it asks for more than its minimum while it has the slack

    def asks_at(elapsed: float) -> int:
        waiting.elapsed_s = elapsed
        return engine._asks(record, want, least)

    lo, hi = 0.0, 1e9  # the last second with room, to the last bit
    assert asks_at(lo) == want and asks_at(hi) != want
    while math.nextafter(lo, hi) < hi:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            mid = math.nextafter(lo, hi)
        lo, hi = (mid, hi) if asks_at(mid) == want else (lo, mid)
    steps = [lo / 2, lo - 1.0, lo - 1e-6, math.nextafter(lo, 0.0), lo]
    assert not any(round_at(e) for e in steps)  # room all along: kept asleep, answered from the window
    assert round_at(hi)  # the first bit past it: no room, woken and made again
    assert engine.jobs["w"].want_g < want
    assert not any(round_at(e) for e in (math.nextafter(hi, 2 * hi), hi + 1e-6, hi + 1.0, 2 * hi))
    waiting.remaining_iters = 1.0  # progress reported while it waits: room again
    assert round_at(hi + 1.0)
    assert engine.jobs["w"].want_g == want and not round_at(hi + 2.0)


class _Resting:
    """A caller that lets the inputs of dormant records rest (`RubickEngine.resting`), as far as it may: before a
    round, every dormant record whose input is the last round's and still held has its clock fields made unreadable;
    they are given back when the engine asks (`bring_forward`), and after the round."""

    def __init__(self, engine) -> None:
        self.engine, self.kept, self.brought = engine, {}, 0
        engine.resting, engine.bring_forward = self.kept, self.give

    def rest(self, jobs: dict, touched) -> None:
        engine = self.engine
        for job_id, job in getattr(engine, "_dormant", {}).items():
            inp = jobs.get(job_id)
            if (inp is job.inp and job_id not in (touched or ())
                    and inp.changed_s < engine.rest_hold(inp.recent_changes)):
                self.kept[job_id] = (inp, {name: getattr(inp, name) for name in CLOCK_FIELDS})
                for name in CLOCK_FIELDS:
                    setattr(inp, name, UNREAD)

    def give(self, ids) -> None:
        for job_id in ids:
            inp, values = self.kept.pop(job_id)
            for name, value in values.items():
                setattr(inp, name, value)
            self.brought += 1

    def end(self) -> None:
        """After a round that ran to its end: those still resting are dormant, not awake (the round asked for every
        one it woke, tried, wrote or finished); all given back."""
        engine, awake = self.engine, {j.id for j in self.engine._awake}
        assert all(engine.is_dormant(job_id) and job_id not in awake for job_id in self.kept)
        brought = self.brought
        self.give(list(self.kept))
        self.brought = brought


@pytest.mark.parametrize("rest", [False, True])
def test_a_held_running_job_sleeps_dormant_until_its_input_hold_placement_or_a_guarantee_would_make_it_otherwise(rest):
    """A running best-effort job held by the restart rule that a round carried over and left as it found it is left
    dormant by the next rounds (not made, placed or indexed again; its queue turn and outcome still given), and made
    again as soon as anything it is made of could differ: its hold ends (the clock), its input is another (a decision),
    a guarantee under its minimum takes GPUs from it, the nodes change. Round by round, every outcome is a fresh
    engine's, handed every input, and a dormant job's pending reason follows the free GPUs at its turn. `rest`: the
    dormant records' inputs rest (`_Resting`), and the engine asks for each before it reads it."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models, quotas={"t0": 16, "t1": 16}).engine
    resting = _Resting(engine) if rest else None
    kind = engine_mod.JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size)
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0), engine_mod.NodeCap("n1", 8, 96, 1600.0)]

    def running(job_id, order, node, gpus, changed_s=10.0):
        return engine_mod.JobIn(job_id, "t1", False, kind, order, 8, 32, Plan(dp=gpus),
                                current={node: (gpus, 4 * gpus)}, current_plan=Plan(dp=gpus), running=True,
                                remaining_iters=1e6, target_iters=1e6, changed_s=changed_s)

    jobs = {"a": running("a", 0, "n0", 4), "h": running("h", 1, "n1", 8)}

    def round_of(touched, nodes=nodes):
        if resting is not None:
            resting.rest(jobs, touched)
        try:
            out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, touched)}
        finally:
            if resting is not None:
                resting.end()
        _as_fresh(engine, oracle, models, nodes, jobs, out)
        return set(engine._dormant), {j.id for j in engine._awake}, out

    round_of(None)
    dormant, awake, _ = round_of(set())  # carried over as found: dormant from the round's end
    assert dormant == {"a", "h"}
    dormant, awake, out = round_of(set())  # not made: neither awake nor given
    assert dormant == {"a", "h"} and not awake and not out
    assert engine.outcome_of("a").pending[0] == "held"  # four GPUs free on its node: it could have grown
    jobs["b"] = running("b", 2, "n0", 4)
    jobs["b"].current, jobs["b"].running, jobs["b"].current_plan = {}, False, None  # a new job takes them
    dormant, awake, out = round_of({"b"})
    assert "a" in dormant and "a" not in awake and out["a"].pending[0] == "no-gpus"  # its turn: none free now
    jobs["b"] = running("b", 2, "n0", 4)  # the agents started it: a decision's input
    dormant, awake, _ = round_of({"b"})
    assert {"a", "h"} <= dormant and "b" in awake
    jobs["a"].changed_s = 1e6  # its hold is over: made again, and not held
    dormant, awake, _ = round_of(set())
    assert "a" in awake and "a" not in dormant
    jobs["a"].changed_s = 10.0  # held again (a change the agents answered): carried, then dormant
    round_of(set())
    dormant, awake, _ = round_of(set())
    assert "a" in dormant
    jobs["g"] = engine_mod.JobIn("g", "t0", True, kind, 3, 8, 32, Plan(dp=8), remaining_iters=1e3, target_iters=1e3)
    dormant, awake, out = round_of({"g"})  # a guarantee under its minimum takes GPUs from held jobs
    taken = {j for j in ("a", "b", "h") if j in out and out[j].reason in ("shrunk", "preempted")}
    assert taken and out["g"].shares and not taken & dormant  # those it took from are finished and made again
    dormant, awake, _ = round_of(set())
    assert taken <= awake
    del jobs["g"]
    round_of({"g"})
    round_of(set())
    before, _, _ = round_of(set())
    assert before  # some are dormant again
    more = [*nodes, engine_mod.NodeCap("n2", 8, 96, 1600.0)]
    dormant, awake, _ = round_of(set(), more)  # the nodes changed: every job placed again, the dormant ones woken
    assert before <= awake
    assert resting is None or resting.brought >= 3  # taken from, woken: asked for


def test_a_running_guarantee_is_carried_over_while_it_asks_what_it_asked(monkeypatch):
    """A running guarantee the last round left as it found it is carried over as a best-effort job is, its guarantee's
    minimum and flag made again for this round's quotas. It is made again where it asks otherwise: its type's margin
    grew (its minimum is worked out again, and no longer fits its quota), or the clock left it no slack to take more
    than its minimum. Round by round, every outcome is a fresh engine's, handed every input."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models, quotas={"t0": 4, "t1": 16}).engine
    kind = engine_mod.JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size)
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0), engine_mod.NodeCap("n1", 8, 96, 1600.0)]
    offload = Plan(dp=8, zero_stage=2, offload=True)

    def holder(job_id, order, node, gpus):
        return engine_mod.JobIn(job_id, "t1", False, kind, order, gpus, 4 * gpus, Plan(dp=gpus),
                                current={node: (gpus, 4 * gpus)}, current_plan=Plan(dp=gpus), running=True,
                                priority=10, remaining_iters=1e6, changed_s=1e6)

    running = engine_mod.JobIn("g", "t0", True, kind, 2, 8, 32, offload, current={"n0": (4, 16)},
                               current_plan=replace(offload, dp=4), running=True, remaining_iters=1000.0,
                               target_iters=1000.0, changed_s=1e6)
    waiting = engine_mod.JobIn("w", "t0", True, kind, 3, 8, 32, offload)
    jobs = {j.job_id: j for j in (holder("h1", 0, "n1", 8), holder("h2", 1, "n0", 4), running, waiting)}
    facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731

    def round_of(touched):
        out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, touched)}
        fresh = make_policy("rubick", oracle=oracle, models=models, quotas=dict(engine.quotas)).engine
        for o in fresh.schedule(nodes, list(jobs.values())):
            assert facts(out.get(o.job_id, engine.outcome_of(o.job_id))) == facts(o)
        record = engine.jobs["g"]
        return record.carried, record.privileged, record.g

    assert round_of(None) == (False, True, 4)  # placed within its quota, charged its minimum
    assert round_of(set()) == (True, True, 4) and round_of(set())[0]  # carried over, its guarantee kept again
    oracle.overshoot["gpt2"] = 0.4  # its type's margin grows: its minimum is the whole request, over the quota
    assert round_of(set())[:2] == (False, False)
    oracle.overshoot["gpt2"] = 0.0
    assert round_of(set()) == (False, True, 4) and round_of(set()) == (True, True, 4)
    running.elapsed_s = 1e7  # its deadline has passed: it asks for its minimum only
    assert round_of(set())[0] is False and engine.jobs["g"].want_g == 4
    assert round_of(set()) == (True, True, 4)


def test_a_running_guarantees_last_outcome_is_given_again_only_while_its_quota_keeps_it_what_it_was():
    """A running guarantee carried over and left as it runs gives its last outcome object again, which the round
    leaves out. Its quota cut under its minimum, it runs on as best-effort: still carried, on the same GPUs, with the
    same detail, but its outcome is made again (it says what became of its quota), as it is when the quota is back.
    Round by round, every outcome is a fresh engine's, handed every input."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models, quotas={"t0": 4}).engine
    kind = engine_mod.JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size)
    nodes = [engine_mod.NodeCap("n0", 4, 48, 800.0)]  # no GPU free to grow on
    offload = Plan(dp=8, zero_stage=2, offload=True)
    running = engine_mod.JobIn("g", "t0", True, kind, 0, 4, 16, replace(offload, dp=4), current={"n0": (4, 16)},
                               current_plan=replace(offload, dp=4), running=True, remaining_iters=1000.0,
                               target_iters=1000.0, changed_s=1e6)  # all it asked for: no pending reason
    (first,) = make_policy("rubick", oracle=oracle, models=models, quotas={"t0": 4}).engine.schedule(nodes, [running])
    running = replace(running, current_plan=first.plan)  # running the plan the round picks: kept as it is
    jobs = {"g": running}
    facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731

    def round_of():
        out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, set())}
        (fresh,) = make_policy("rubick", oracle=oracle, models=models, quotas=dict(engine.quotas)).engine.schedule(
            nodes, [running])
        assert facts(out.get("g", engine.outcome_of("g"))) == facts(fresh)
        record = engine.jobs["g"]
        return "g" in out, record.carried, record.privileged, record.g

    engine.schedule_changed(nodes, jobs, None)
    assert round_of()[1:] == (True, True, 4) and round_of() == (False, True, True, 4)  # the same outcome: left out
    engine.quotas["t0"] = 0
    assert round_of() == (True, True, False, 4) and round_of() == (False, True, False, 4)
    assert engine.outcome_of("g").detail["quota"] == "none"
    engine.quotas["t0"] = 2  # a quota again, under its minimum: the same flag and detail, but its outcome says so
    assert round_of() == (True, True, False, 4) and engine.outcome_of("g").detail["quota"] == "exceeded"
    engine.quotas["t0"] = 4
    assert round_of() == (True, True, True, 4) and round_of() == (False, True, True, 4)


def test_a_running_jobs_outcome_is_given_again_only_while_every_part_of_it_is_the_same():
    """A job left as it runs is given last round's outcome object again (the service sees at once that nothing
    changed), but only while every part of it is what a fresh engine gives: its first round says `start`, the next
    (the same GPUs, now its own) `keep`, and a refit that changes its speed gives a new outcome too."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    kind = engine_mod.JobKind(models["vit"], models["vit"].spec.global_batch_size)
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0)]
    facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731

    def round_of(inp):
        (out,) = engine.schedule(nodes, [inp])
        (fresh,) = make_policy("rubick", oracle=oracle, models=models).engine.schedule(nodes, [inp])
        assert facts(out) == facts(fresh)
        return out

    first = round_of(engine_mod.JobIn("j", "t0", False, kind, 0, 8, 32, Plan(dp=8), requested_mem_gb=64.0))
    assert first.reason == "start" and first.shares
    current = {n: (g, c) for n, (g, c, _) in first.shares.items()}
    memory = {n: m for n, (_, _, m) in first.shares.items()}
    assert all(m > 0 for m in memory.values())  # held as it was given: every part of the outcome but its reason
    inp = engine_mod.JobIn("j", "t0", False, kind, 0, 8, 32, Plan(dp=8), requested_mem_gb=64.0, current=current,
                           current_mem=memory, current_plan=first.plan, running=True, remaining_iters=1e6)
    kept = round_of(inp)
    assert kept.reason == "keep" and kept.shares == first.shares and kept is not first
    assert round_of(inp) is kept  # nothing changed: the same object
    params = {**oracle.params.get("vit", PerfParams()).as_dict()}
    params["k_bwd"] = params.get("k_bwd", 1.0) * 1.5
    oracle.update(ModelUpdated(model_type="vit", version=7, params=params, n_points=1, rmsle=0.0))
    after = round_of(inp)
    assert after is not kept and after.throughput != kept.throughput
    assert round_of(inp) is after


def test_a_round_told_which_inputs_changed_looks_at_the_sleepers_of_a_refitted_kind_again():
    """Handed the inputs as a mapping with the jobs whose inputs changed (`touched`), a round looks at no other
    sleeper, but those of a kind whose model was refitted: their records are made again from the new curves. Round
    by round the outcomes are a fresh engine's, handed every input; a job that left is forgotten."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0)]
    gpt2 = engine_mod.JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size)
    bert = engine_mod.JobKind(models["bert"], models["bert"].spec.global_batch_size)
    facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731
    holder = engine_mod.JobIn("holder", "t0", False, bert, 0, 8, 32, Plan(dp=8), current={"n0": (8, 32)},
                              current_plan=Plan(dp=8), running=True, priority=5, remaining_iters=1e6, changed_s=0.0)
    waiting = {f"w{i}": engine_mod.JobIn(f"w{i}", "t0", False, gpt2 if i % 2 else bert, i + 1, 4, 16, Plan(dp=4))
               for i in range(6)}
    looked, made = [], []
    real_fall, real_prepare = engine_mod.RubickEngine._fall_asleep, engine_mod.RubickEngine._prepare

    def fall(self, job, kind, version):  # a job looked at and found asleep
        looked.append(job.id)
        return real_fall(self, job, kind, version)

    def prepare(self, inp, memo=None, record=None):  # a job looked at and made again
        looked.append(inp.job_id)
        made.append(inp.job_id)
        return real_prepare(self, inp, memo, record)

    def round_of(jobs, touched):
        looked.clear()
        made.clear()
        out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, touched)}
        seen = (list(looked), list(made))
        fresh = make_policy("rubick", oracle=oracle, models=models).engine.schedule(nodes, list(jobs.values()))
        for o in fresh:  # a job left out gives last round's outcome again
            assert facts(out.get(o.job_id, engine.outcome_of(o.job_id))) == facts(o)
        assert set(engine.jobs) == set(jobs)
        looked[:], made[:] = seen
        return out

    engine_mod.RubickEngine._fall_asleep, engine_mod.RubickEngine._prepare = fall, prepare
    try:
        jobs = {"holder": holder, **waiting}
        round_of(jobs, None)
        round_of(jobs, set())
        assert engine._sleeping.keys() == waiting.keys()
        round_of(jobs, set())
        assert not set(looked) & waiting.keys()  # nothing touched them: not looked at
        params = dict(oracle.params.get("gpt2", PerfParams()).as_dict())
        params["k_bwd"] = params.get("k_bwd", 1.0) * 3.0
        oracle.update(ModelUpdated(model_type="gpt2", version=5, params=params, n_points=1, rmsle=0.0))
        round_of(jobs, set())
        assert set(looked) & waiting.keys() == set(made) & waiting.keys() == {"w1", "w3", "w5"}  # made again
        del jobs["holder"]  # its GPUs free: sleepers of both kinds are tried
        out = round_of(jobs, {"holder"})
        assert any(o.shares for o in out.values())
        del jobs["w0"]
        round_of(jobs, {"w0"})
    finally:
        engine_mod.RubickEngine._fall_asleep, engine_mod.RubickEngine._prepare = real_fall, real_prepare


@pytest.mark.parametrize("rest", [False, True])
def test_a_round_cut_short_makes_the_next_look_at_every_input(rest):
    """A round that ends in an error leaves its sleepers and dormant records half looked at: the next round, though
    told which inputs changed, looks at every one, and its outcomes are a fresh engine's. `rest`: the dormant record's
    input rests (`_Resting`) through both rounds, and the next round asks for it before it reads it."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    resting = _Resting(engine) if rest else None
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0)]
    bert = engine_mod.JobKind(models["bert"], models["bert"].spec.global_batch_size)
    holder = engine_mod.JobIn("holder", "t0", False, bert, 0, 8, 32, Plan(dp=8), current={"n0": (8, 32)},
                              current_plan=Plan(dp=8), running=True, priority=5, remaining_iters=1e6, changed_s=0.0)
    jobs = {"holder": holder, **{f"w{i}": engine_mod.JobIn(f"w{i}", "t0", False, bert, i + 1, 4, 16, Plan(dp=4))
                                 for i in range(3)}}
    engine.schedule_changed(nodes, jobs, None)
    engine.schedule_changed(nodes, jobs, set())
    assert engine._sleeping.keys() == {"w0", "w1", "w2"}
    engine.schedule_changed(nodes, jobs, set())
    assert engine._dormant.keys() == {"holder"}  # held, left as it was found: dormant too
    real = engine_mod.RubickEngine._place_current

    def broken(self):
        raise RuntimeError("cut short")

    engine_mod.RubickEngine._place_current = broken
    if resting is not None:
        resting.rest(jobs, {"w0"})
    try:
        with pytest.raises(RuntimeError):
            engine.schedule_changed(nodes, jobs, {"w0"})
    finally:
        engine_mod.RubickEngine._place_current = real
    if resting is not None:
        assert resting.kept.keys() == {"holder"}  # still resting: the next round is told nothing of it
    out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, set())}  # nothing changed since
    if resting is not None:
        assert not resting.kept and resting.brought == 1
    fresh = make_policy("rubick", oracle=oracle, models=models).engine.schedule(nodes, list(jobs.values()))
    facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731
    assert [facts(out.get(o.job_id, engine.outcome_of(o.job_id))) for o in fresh] == list(map(facts, fresh))
    assert fresh[0].job_id == "holder" and fresh[0].shares and set(engine.jobs) == set(jobs)


def _cut_short_at_finishing(engine, nodes, jobs, touched, job_id: str) -> None:
    """A round of `engine` that ends in an error as it makes `job_id`'s outcome (the outcomes made before it are never
    handed over)."""
    real = engine_mod.RubickEngine._finish

    def broken(self, job):
        if job.id == job_id:
            raise RuntimeError("cut short")
        return real(self, job)

    engine_mod.RubickEngine._finish = broken
    try:
        with pytest.raises(RuntimeError):
            engine.schedule_changed(nodes, jobs, touched)
    finally:
        engine_mod.RubickEngine._finish = real


def test_an_outcome_made_in_a_round_cut_short_is_given_by_the_next():
    """A round that ends in an error after some outcomes were made gave none of them: the next round gives them,
    though they are the objects it would otherwise leave out as already given."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0)]
    bert = engine_mod.JobKind(models["bert"], models["bert"].spec.global_batch_size)
    holder = engine_mod.JobIn("b", "t0", False, bert, 0, 4, 16, Plan(dp=4), current={"n0": (4, 16)},
                              current_plan=Plan(dp=4), running=True, remaining_iters=1e6, changed_s=0.0)
    jobs = {"b": holder}
    engine.schedule_changed(nodes, jobs, None)
    assert engine.schedule_changed(nodes, jobs, set()) == []  # nothing changed: nothing given again
    jobs["a"] = engine_mod.JobIn("a", "t0", False, bert, 1, 4, 16, Plan(dp=4), priority=5)  # finished before "b"
    _cut_short_at_finishing(engine, nodes, jobs, {"a"}, "b")
    assert engine.jobs["a"].given is not None  # made, and never handed over
    out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, set())}
    fresh = make_policy("rubick", oracle=oracle, models=models).engine.schedule(nodes, list(jobs.values()))
    facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731
    assert sorted(out) == ["a", "b"] and [facts(out[o.job_id]) for o in fresh] == list(map(facts, fresh))


def test_sleepers_answered_from_the_failed_attempts_give_their_outcomes_again_after_a_round_cut_short():
    """Sleepers tried while GPUs are free, and answered from the round's failed attempts with the reason their last
    outcome gives, do not have that outcome made again, and the round leaves it out. After a round cut short, which
    handed over nothing, their outcomes are given again."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0)]
    bert = engine_mod.JobKind(models["bert"], models["bert"].spec.global_batch_size)
    large = engine_mod.JobKind(models["llama30"], models["llama30"].spec.global_batch_size)  # more GPUs than free
    holder = engine_mod.JobIn("b", "t0", False, bert, 0, 7, 28, Plan(dp=7), current={"n0": (7, 28)},
                              current_plan=Plan(dp=7), running=True, remaining_iters=1e6, changed_s=0.0, priority=9)
    jobs = {"b": holder, **{f"w{i}": engine_mod.JobIn(f"w{i}", "t0", False, large, i + 1, 8, 32, Plan(dp=8))
                            for i in range(3)}}
    facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731
    fresh = make_policy("rubick", oracle=oracle, models=models).engine.schedule(nodes, list(jobs.values()))

    def round_of():
        out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, set())}
        assert [facts(out.get(o.job_id, engine.outcome_of(o.job_id))) for o in fresh] == list(map(facts, fresh))
        return set(out), {j.id for j in engine._woken if j.answered == engine._round_no}

    engine.schedule_changed(nodes, jobs, None)
    assert round_of() == (set(), {"w1", "w2"})  # tried, answered as "w0" was: nothing made again, nothing given
    _cut_short_at_finishing(engine, nodes, jobs, set(), "b")
    assert round_of()[0] >= {"w0", "w1", "w2"}  # all tried again, and given again
    assert round_of() == (set(), {"w1", "w2"})


def _scenario(rng: random.Random, models) -> tuple[list, list]:
    """Small nodes and jobs spread over several of them, running at random priorities, and jobs waiting: searches
    shrink jobs that hold GPUs on more than one node."""
    nodes = [engine_mod.NodeCap(f"n{i}", 4, 48, 800.0) for i in range(rng.randint(3, 6))]
    free = {n.name: 4 for n in nodes}
    kinds = [(name, engine_mod.JobKind(models[name], models[name].spec.global_batch_size))
             for name in ("gpt2", "bert", "vit")]
    jobs = []
    for i in range(rng.randint(3, 9)):
        _, kind = rng.choice(kinds)
        current = {}
        for n in rng.sample(sorted(free), rng.randint(1, 3)):
            g = min(free[n], rng.randint(1, 3))
            if g > 0:
                free[n] -= g
                current[n] = (g, 4 * g)
        gpus = sum(g for g, _ in current.values())
        if not gpus:
            continue
        jobs.append(engine_mod.JobIn(f"r{i}", "t0", False, kind, i, gpus, 4 * gpus, Plan(dp=gpus), current=current,
                                     current_plan=Plan(dp=gpus), running=True, priority=rng.randint(0, 2),
                                     remaining_iters=rng.choice([10.0, 1e7]), changed_s=1e6))
    for i in range(rng.randint(0, 4)):
        _, kind = rng.choice(kinds)
        g = rng.choice([1, 2, 4])
        jobs.append(engine_mod.JobIn(f"w{i}", "t0", False, kind, 100 + i, g, 4 * g, Plan(dp=g),
                                     priority=rng.randint(0, 2)))
    return nodes, jobs


def test_searches_over_jobs_on_several_nodes_find_what_a_search_without_memos_finds(monkeypatch):
    """Random rounds on small nodes, where jobs hold GPUs on several nodes and are shrunk one GPU at a time: every
    outcome and the hold flag of an engine with its memos (the round's reads of the nodes, an attempt's own reads
    kept up to date as it shrinks jobs) are those of an engine that reads every node again at every step."""
    oracle, models = from_modeler(MODELER)
    facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731
    rng = random.Random(5)  # among its cases, one where a stale read of a job shrunk on another node changes a choice
    cases = [_scenario(rng, models) for _ in range(150)]
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    with_memos = []
    for nodes, jobs in cases:
        with_memos.append(([facts(o) for o in engine.schedule(nodes, jobs)], engine.held_back))
    real = engine_mod.RubickEngine._lowest_slope_over_min
    monkeypatch.setattr(engine_mod.RubickEngine, "_lowest_slope_over_min",
                        lambda self, node, job, limit, memo=None, live=None: real(self, node, job, limit))
    monkeypatch.setattr(engine_mod.RubickEngine, "_repeat_key", lambda self, job: None)
    bare = make_policy("rubick", oracle=oracle, models=models).engine
    without = [([facts(o) for o in bare.schedule(nodes, jobs)], bare.held_back) for nodes, jobs in cases]
    shrunk = sum(any(o[4] == "shrunk" for o in outs) for outs, _ in with_memos)
    assert shrunk > 10  # searches shrank jobs
    assert with_memos == without


@pytest.mark.parametrize("seed,mem_gb", [(1, 1600.0), (2, 20.0), (3, 1600.0)])
def test_a_running_job_with_less_work_left_than_a_restart_is_not_searched(monkeypatch, seed, mem_gb):
    """A running job whose work left at its current speed takes less than one restart, or whose gain at the most speed
    any allocation it could gather gives (`PlanBook.ceiling`) would not pay one, in a round already to be run
    again, is answered `held` without a search (`_too_short`): each time, the search itself, run there and then, is
    refused by the restart rule and leaves every job as it was; the events published are those of a core that
    searches for every such job. With 20 GB a node, some plans' host memory does not fit where the job runs."""
    real = engine_mod.RubickEngine._too_short
    search = engine_mod.RubickEngine._schedule_job
    seen = {"short": 0, "not": 0, "ceiling": 0}

    def checked(self, job, *, _real=real):
        answer = _real(self, job)
        if not answer:
            seen["not"] += 1
            return False
        seen["short"] += 1
        if self._work_left_s(job) > self.restart_cost_s:  # more work left than a restart: the speed ceiling answered
            seen["ceiling"] += 1
        state = {j.id: (dict(j.g_on), dict(j.c_on), dict(j.mem_on), j.best, j.forced) for j in self.jobs.values()}
        held_back, why = self.held_back, self.why.get(job.id)
        monkeypatch.setattr(engine_mod.RubickEngine, "_too_short", lambda self, job: False)
        try:
            assert search(self, job) is True
        finally:
            monkeypatch.setattr(engine_mod.RubickEngine, "_too_short", checked)
        assert self.why[job.id] == "held"
        assert {j.id: (dict(j.g_on), dict(j.c_on), dict(j.mem_on), j.best, j.forced)
                for j in self.jobs.values()} == state
        assert self.held_back == held_back
        if why is None:
            del self.why[job.id]
        else:
            self.why[job.id] = why
        return True

    monkeypatch.setattr(engine_mod.RubickEngine, "_too_short", checked)
    shortcut, _ = drive(seed, nodes=24, jobs=90, mem_gb=mem_gb, short=True, hold_s=10.0)
    assert seen["short"] > 50 and seen["not"] > 500 and seen["ceiling"] > 20, seen

    monkeypatch.setattr(engine_mod.RubickEngine, "_too_short", lambda self, job: False)
    searched_each_time, _ = drive(seed, nodes=24, jobs=90, mem_gb=mem_gb, short=True, hold_s=10.0)
    assert sum(b"plan.decided" in b for b in shortcut) >= 10
    assert shortcut == searched_each_time


@pytest.mark.parametrize("seed,mem_gb", [(1, 1600.0), (2, 20.0), (3, 1600.0)])
def test_a_search_stops_where_the_running_jobs_it_shrank_cost_more_restarts_than_its_work_left(monkeypatch, seed,
                                                                                             mem_gb):
    """A running job's search, in a round already to be run again, stops where the restarts of the running jobs it has
    shrunk and its own cost more than its work left at its current speed, or than it would save at the most speed any
    allocation it could gather gives (`_cannot_pay`): each time, it is undone,
    every job as it was before the attempt, and says `held`; the events published are those of a core whose searches
    run to their end. With 20 GB a node, some plans' host memory does not fit where the job runs."""
    real = engine_mod.RubickEngine._cannot_pay
    search, move = engine_mod.RubickEngine._schedule_job, engine_mod.RubickEngine._move
    seen = {"stopped": 0, "asked": 0, "ceiling": 0}
    stopped: list[bool] = []
    shrunk: set[str] = set()
    """the running jobs the attempt under way has taken GPUs from"""

    def moved(self, jr, node, src, dst, gpus):
        if src is not None and src.inp.running:
            shrunk.add(src.id)
        return move(self, jr, node, src, dst, gpus)

    def checked(self, job, g0, restarts, *, _real=real):
        seen["asked"] += 1
        assert restarts == 1 + len(shrunk)  # asked as each running job is first shrunk, with the job's own restart
        answer = _real(self, job, g0, restarts)
        if answer:
            seen["stopped"] += 1
            assert job.id == job_of[0] and 1 <= g0 == started[0] and job.inp.running
            if self._work_left_s(job) > self.restart_cost_s * restarts:  # the speed ceiling answered
                seen["ceiling"] += 1
            stopped.append(True)
        return answer

    def state(self):
        return ({j.id: (dict(j.g_on), dict(j.c_on), dict(j.mem_on), j.best, j.forced) for j in self.jobs.values()},
                dict(self.free_g), dict(self.free_c), dict(self.free_m), {n: set(on) for n, on in self.on_node.items()})

    job_of, started = [""], [0]

    def watched(self, job, jr=None, only=None):
        before = state(self)
        stopped.clear()
        shrunk.clear()
        job_of[0], started[0] = job.id, job.g
        ok = search(self, job, jr, only)
        if stopped:  # `held_back`: set before the attempt, or by it on its way (a held job passed over)
            assert ok is True and self.why[job.id] == "held" and self.held_back
            assert state(self) == before
        return ok

    monkeypatch.setattr(engine_mod.RubickEngine, "_cannot_pay", checked)
    monkeypatch.setattr(engine_mod.RubickEngine, "_schedule_job", watched)
    monkeypatch.setattr(engine_mod.RubickEngine, "_move", moved)
    shortcut, _ = drive(seed, nodes=24, jobs=90, mem_gb=mem_gb, short=True, hold_s=10.0)
    assert seen["stopped"] > 20 and seen["asked"] > 200 and seen["ceiling"] > 20, seen

    monkeypatch.setattr(engine_mod.RubickEngine, "_cannot_pay", lambda self, job, g0, restarts: False)
    searched_to_the_end, _ = drive(seed, nodes=24, jobs=90, mem_gb=mem_gb, short=True, hold_s=10.0)
    assert sum(b"plan.decided" in b for b in shortcut) >= 10
    assert shortcut == searched_to_the_end


@pytest.mark.parametrize("seed,short", [(1, False), (2, False), (3, True)])
def test_a_search_that_passed_over_a_held_job_passes_nodes_where_only_held_jobs_are_below_it(monkeypatch, seed, short):
    """Once an attempt has passed over a held job, `_none_below` leaves the held jobs out: each time that makes it
    pass a node it would not have passed before, the search there (`_lowest_slope_over_min`, read afresh) finds no
    job to shrink, and the flags it would set are set already; the events published are those of a core whose
    `_none_below` looks at every job."""
    real = engine_mod.RubickEngine._none_below
    seen = {"passed": 0, "same": 0}

    def every_job(self, node, job, victims, limit=None):
        skipped, self._skipped_held = self._skipped_held, False
        try:
            return real(self, node, job, victims, limit)
        finally:
            self._skipped_held = skipped

    def checked(self, node, job, victims, limit=None):
        answer = real(self, node, job, victims, limit)
        if not answer or every_job(self, node, job, victims, limit):
            seen["same"] += 1
            return answer
        seen["passed"] += 1
        assert self._skipped_held and self.held_back and job.g >= job.min_g
        assert self._lowest_slope_over_min(node, job, job.up() if limit is None else limit) is None
        assert self._skipped_held and self.held_back
        return answer

    monkeypatch.setattr(engine_mod.RubickEngine, "_none_below", checked)
    passing, _ = drive(seed, nodes=24, jobs=120, short=short, hold_s=10.0 if short else None)
    assert seen["passed"] > 20 and seen["same"] > 100, seen

    monkeypatch.setattr(engine_mod.RubickEngine, "_none_below", every_job)
    looking_at_every_job, _ = drive(seed, nodes=24, jobs=120, short=short, hold_s=10.0 if short else None)
    assert sum(b"plan.decided" in b for b in passing) >= 10
    assert passing == looking_at_every_job


@pytest.mark.parametrize("seed", [1, 2])
def test_a_sleeper_looked_at_again_leaves_the_list_of_keys_at_once(monkeypatch, seed):
    """A sleeper a round looks at again (`_fall_awake`) takes its key out of `_sleepers` at once, and one found asleep
    again is listed again: after every round each sleeper's key is in the list once, the list is sorted, and it holds
    fewer keys of jobs no longer asleep than a list that keeps them until it is made again; the events published are
    those of an engine that keeps them."""
    real_round = engine_mod.RubickEngine._round
    seen = {"rounds": 0, "stale": 0, "asleep": 0}

    def checked(self, nodes, jobs, touched=None):
        out = real_round(self, nodes, jobs, touched)
        keys = self._sleepers
        assert all(a < b for a, b in zip(keys, keys[1:]))
        listed = {id(k) for k in keys}
        for job in self._sleeping.values():
            assert job.listed and id(job.key) in listed
        seen["rounds"] += 1
        seen["asleep"] += len(self._sleeping)
        seen["stale"] += sum(1 for k in keys if not self._current(k, self._round_no))
        return out

    real_fall_awake = engine_mod.RubickEngine._fall_awake

    def keeping(self, job):  # the key stays in the list, passed over by `_wake` until the list is made again
        listed, job.listed = job.listed, False  # not listed: nothing to take out
        real_fall_awake(self, job)
        job.listed = listed  # found asleep again, its key (still in the list) is its own again

    monkeypatch.setattr(engine_mod.RubickEngine, "_round", checked)
    at_once, _ = drive(seed, nodes=6, jobs=200, steps=40, owners=True)
    assert seen["rounds"] > 100 and seen["asleep"] > 1000, seen
    stale = seen["stale"]
    seen.update(rounds=0, stale=0, asleep=0)
    monkeypatch.setattr(engine_mod.RubickEngine, "_fall_awake", keeping)
    kept, _ = drive(seed, nodes=6, jobs=200, steps=40, owners=True)
    assert seen["stale"] > 2 * stale, (seen["stale"], stale)
    assert sum(b"plan.decided" in b for b in at_once) >= 10
    assert at_once == kept


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_attempt_undone_leaves_no_job_it_took_cpus_from_marked_forced(monkeypatch, seed):
    """An attempt that takes CPUs from the jobs beside it (`_reclaim_cpus`) and is then undone, refused by the restart
    rule or settling on nothing, leaves those jobs as it found them, `forced` included: a job marked forced keeps no
    plan against the restart rule (`_finish`), so a flag left behind would restart it for nothing. With few CPUs a node,
    the ZeRO-Offload jobs take CPUs from others."""
    real_search, real_reclaim = engine_mod.RubickEngine._schedule_job, engine_mod.RubickEngine._reclaim_cpus
    seen = {"undone": 0, "kept": 0, "reclaims": 0}

    def reclaim(self, jr, node, job, short):
        seen["reclaims"] += 1
        return real_reclaim(self, jr, node, job, short)

    def search(self, job, jr=None, only=None):
        if jr is not None:  # a repack's step: undone or kept with the others
            return real_search(self, job, jr, only)
        state = {j.id: (dict(j.g_on), dict(j.c_on), j.forced) for j in self.jobs.values()}
        reclaims = seen["reclaims"]
        answer = real_search(self, job, jr, only)
        if seen["reclaims"] > reclaims:
            after = {j.id: (dict(j.g_on), dict(j.c_on), j.forced) for j in self.jobs.values()}
            if {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in state.items()}:
                seen["undone"] += 1
                assert after == state, job.id
            else:
                seen["kept"] += 1
        return answer

    monkeypatch.setattr(engine_mod.RubickEngine, "_reclaim_cpus", reclaim)
    monkeypatch.setattr(engine_mod.RubickEngine, "_schedule_job", search)
    drive(seed, nodes=16, jobs=160, steps=30, cpus=12)
    assert seen["undone"] > 5 and seen["kept"] > 5, seen


@pytest.mark.parametrize("seed,policy", [(1, "rubick"), (2, "rubick"), (1, "rubick-e"), (2, "rubick-e")])
def test_the_rooms_kept_between_attempts_order_the_nodes_as_rooms_worked_out_afresh(monkeypatch, seed, policy):
    """A job under its minimum visits the nodes by room (`_by_room`): a guarantee placed, or under `rubick-e` every job
    asking for its fixed GPUs. The rooms are worked out for every node at the round's first such call, then kept, and
    at a later call worked out again only on the nodes marked since (moves, releases, trims, undone attempts and jobs
    indexed again). At every call the nodes come in the order that working out every node's room then gives: the free
    GPUs and those the index's jobs hold there over their own minimum, most first, the job's own nodes ahead."""
    real = engine_mod.RubickEngine._by_room
    counts = {"calls": 0, "kept": 0, "again": 0}

    def afresh(self, job, mine, seen):
        heap = []
        for n in self.order:
            if n in seen:
                continue
            out = soft = free = self.free_g[n]
            for vid in self.on_node[n]:
                if vid != job.id and vid in self._dkey:
                    v = self.jobs[vid]
                    take = min(v.g_on.get(n, 0), v.g - v.min_g)
                    out += take
                    soft += 0 if v.privileged else take
            if out > 0:
                heap.append((-out, -soft, -free, n))
        return mine + [e[3] for e in sorted(heap)]

    def checked(self, job, mine, seen):
        kept = self._room_of is not None
        counts["again"] += len(self._room_stale) if kept else 0
        order = list(real(self, job, mine, seen))
        assert order == afresh(self, job, mine, seen), job.id
        counts["calls"] += 1
        counts["kept"] += kept
        return iter(order)

    monkeypatch.setattr(engine_mod.RubickEngine, "_by_room", checked)
    drive(seed, nodes=16, jobs=160, steps=30, cpus=12, policy=policy)
    assert counts["kept"] > 20 and counts["again"] > 20 and counts["calls"] > counts["kept"], counts


@pytest.mark.parametrize("seed,policy", [(1, "rubick"), (2, "rubick"), (1, "rubick-r")])
def test_the_free_nodes_kept_in_order_are_those_listed_afresh(monkeypatch, seed, policy):
    """The nodes with free GPUs, most free first (`_free_nodes`), are kept in order through a round and put in place
    again only where free GPUs were written since (moves, releases, trims, undone attempts). At every call they are
    the nodes a fresh stable sort of every node by its free GPUs gives, and `_any_free` says whether there is one."""
    real_nodes, real_any = engine_mod.RubickEngine._free_nodes, engine_mod.RubickEngine._any_free
    counts = {"lists": 0, "kept": 0, "anys": 0}

    def fresh(self):
        free = self.free_g
        return sorted([n for n, g in free.items() if g > 0], key=free.__getitem__, reverse=True)

    def listed(self):
        counts["kept"] += self._free_keys is not None and self._free_list is None and bool(self._free_dirty)
        got = real_nodes(self)
        assert got == fresh(self)
        counts["lists"] += 1
        return got

    def any_free(self):
        got = real_any(self)
        assert got == bool(fresh(self))
        counts["anys"] += 1
        return got

    monkeypatch.setattr(engine_mod.RubickEngine, "_free_nodes", listed)
    monkeypatch.setattr(engine_mod.RubickEngine, "_any_free", any_free)
    drive(seed, nodes=16, jobs=160, steps=30, cpus=12, policy=policy)
    assert counts["lists"] > 100 and counts["kept"] > 50 and counts["anys"] > 100, counts


@pytest.mark.parametrize("seed,policy", [(1, "rubick"), (2, "rubick"), (1, "rubick-r")])
def test_the_index_as_each_attempt_of_the_queue_begins_is_the_one_made_afresh(monkeypatch, seed, policy):
    """As each attempt of the round's queue begins, the index of the jobs a search may shrink (`by_down`, `_dkey`, each
    node's `_node_keys` and those of the jobs not held, and the arrays of their lowest) is the one made afresh from the
    jobs as they are then: every job holding GPUs over its minimum (a guarantee it keeps with a GPU less on its smallest
    node), keyed by priority and slope down, listed under each node it holds. A job indexed again with its key and
    nodes as they were is left as it is (`_reindex`): an attempt undone leaves most of them so."""
    real = engine_mod.RubickEngine._schedule_job
    counts = {"checked": 0, "listed": 0}

    def fresh(self):
        keys = {}
        for j in self.jobs.values():
            if j.g > 0 and self._over_min(j) and (not j.privileged or self._keeps_guarantee(
                    j, min(j.g_on, key=lambda n: (j.g_on[n], n)))):
                keys[j.id] = (j.inp.priority, j.down(), -j.inp.order, j.id)
        return keys

    def checked(self, job, jr=None, only=None):
        if self._failed is not None and jr is None and only is None:
            keys = fresh(self)
            assert self._dkey == keys
            assert self.by_down == sorted(keys.values())
            for node, i in self._nidx.items():
                listed = sorted(k for vid, k in keys.items() if node in self.jobs[vid].g_on)
                assert self._node_keys[node] == listed, node
                unheld = [k for k in listed if k[3] not in self.held]
                assert self._unheld_keys.get(node, []) == unheld
                for p, s, ks in ((self._lo_p, self._lo_s, listed), (self._un_p, self._un_s, unheld)):
                    assert (p[i], s[i]) == ((ks[0][0], ks[0][1]) if ks else (math.inf, math.inf))
                assert self._lo_o[i] == (listed[0][2] if listed else math.inf)
            counts["checked"] += 1
            counts["listed"] += len(keys)
        return real(self, job, jr, only)

    monkeypatch.setattr(engine_mod.RubickEngine, "_schedule_job", checked)
    drive(seed, nodes=12, jobs=120, steps=24, cpus=12, policy=policy)
    assert counts["checked"] > 200 and counts["listed"] > 2000, counts


@pytest.mark.parametrize("seed,policy,nodes,quota", [(1, "rubick", 3, 24), (2, "rubick", 3, 24), (1, "rubick-r", 3, 24),
                                                     (1, "rubick", 16, 64)])
def test_a_job_under_its_minimum_is_short_of_gpus_as_the_whole_count_says(monkeypatch, seed, policy, nodes, quota):
    """A job under its minimum fails at once where the free GPUs and those the jobs of the index hold over their
    minimums (less its own) add up to fewer than it lacks (`_short_of`), the count stopped once it covers what is
    lacking. At every call, every job of the index but the one asking holds at least one GPU over its minimum (what
    lets the count stop), and the answer is the one the whole count gives. With quotas of the whole cluster on three
    nodes, guarantees fall short; on sixteen, a few repacks move jobs, whose placing under a minimum asks too."""
    real, real_at_least = engine_search._Search._short_of, engine_guarantees._Guarantees._at_least
    counts, repacking = Counter(), []

    def checked(self, job):
        over = [self.jobs[k[3]].g - self.jobs[k[3]].min_g for k in self.by_down if k[3] != job.id]
        assert all(d >= 1 for d in over), over
        whole = job.g + sum(self.free_g.values()) + sum(over) < job.min_g
        got = real(self, job)
        assert got == whole
        counts["short" if got else "covered"] += 1
        counts["counted"] += not got and job.g + sum(self.free_g.values()) < job.min_g  # the index's jobs counted
        counts["in a repack"] += bool(repacking)
        return got

    def at_least(self, *args):
        repacking.append(True)
        try:
            return real_at_least(self, *args)
        finally:
            repacking.pop()

    monkeypatch.setattr(engine_search._Search, "_short_of", checked)
    monkeypatch.setattr(engine_guarantees._Guarantees, "_at_least", at_least)
    drive(seed, nodes=nodes, jobs=80 if nodes == 3 else 200, steps=24, cpus=96, policy=policy, quota=quota)
    assert counts["covered"] > 50 and counts["counted"] > 5, counts
    assert counts["short"] > 5 if nodes == 3 else counts["in a repack"] >= 1, counts


def _repack_as_listed(engine, job):
    """`_repack_plan` read the plain way: every node listed for each pick, the least picked by a key function."""
    need = packed(max(1, job.min_g), engine.book.node_gpus)
    if len(need) > len(engine.order):
        return None
    pinned = {n: 0 for n in engine.order}
    movable = {n: [] for n in engine.order}
    size = {}
    for v in engine.jobs.values():
        if v is job or not v.privileged or v.g <= 0:
            continue
        g = engine._size_in_time(v) if len(v.g_on) == 1 else None
        if g is not None:
            movable[next(iter(v.g_on))].append(v)
            size[v.id] = g
        else:
            for n, g in v.g_on.items():
                pinned[n] += g
    load = {n: sum(size[v.id] for v in movable[n]) for n in engine.order}
    cap = {n: engine.nodes[n].gpus - pinned[n] for n in engine.order}
    chosen = []
    for want in need:
        fits = [n for n in engine.order if n not in chosen and cap[n] >= want]
        if not fits:
            return None
        chosen.append(min(fits, key=lambda n: (load[n], pinned[n], n)))
    room = {n: cap[n] - load[n] for n in engine.order}
    for n, want in zip(chosen, need):
        room[n] = cap[n] - want
    moves = []
    for v in sorted((v for n in chosen for v in movable[n]), key=lambda v: (-size[v.id], v.id)):
        g, home = size[v.id], next(iter(v.g_on))
        if room[home] >= g:
            room[home] -= g
            continue
        fits = [n for n in engine.order if room[n] >= g]
        if not fits:
            return None
        to = min(fits, key=lambda n: (room[n], n))
        room[to] -= g
        moves.append((v, to))
    return chosen, moves, size


@pytest.mark.parametrize("seed,quota", [(1, 64), (2, 64), (1, 32)])
def test_a_repack_picks_the_nodes_and_moves_a_plain_reading_picks(monkeypatch, seed, quota):
    """A repack's plan (`_repack_plan`: the nodes to clear, the jobs to move and where, each picked as the least of a
    key in one pass over the nodes) is, at every call, the one a reading that lists the nodes for each pick and takes
    the least by a key function gives."""
    real = engine_guarantees._Guarantees._repack_plan
    counts = Counter()

    def checked(self, job):
        got = real(self, job)
        assert got == _repack_as_listed(self, job)
        counts["none" if got is None else "moves" if got[1] else "stays"] += 1
        return got

    monkeypatch.setattr(engine_guarantees._Guarantees, "_repack_plan", checked)
    drive(seed, nodes=16, jobs=240 if quota == 32 else 200, steps=24, cpus=96, quota=quota)
    assert counts["moves"] >= 1 and counts["none"] > 20, counts


@pytest.mark.parametrize("seed", [1, 2])
def test_a_record_carried_over_is_placed_as_one_made_again(monkeypatch, seed):
    """A best-effort running job's record carried over from the last round (`_prepare`: its input, allocation and
    model version the same objects, nothing touched or marked it) is, once `_place_current` has placed it, what a record
    made again and placed gives: the GPUs, CPUs and memory of its allocation, its best plan on them, no flag, reason or
    detail. Where a part of it no longer fits (every node lost for a while, in this drive), it is made again and placed
    the usual way. The events published are those of an engine that makes every record again
    (`test_the_memos_change_no_decision`)."""
    real = engine_mod.RubickEngine._place_current
    counts = {"carried": 0, "again": 0}

    def placed(self):
        carried = [j for j in self._awake if j.carried]
        real(self)
        for job in carried:
            if not job.carried:  # did not fit: made again, and placed the usual way
                counts["again"] += 1
                continue
            counts["carried"] += 1
            rows = [(n, g, c, m) for n, (g, c) in sorted(job.inp.current.items()) if g > 0
                    for m in [job.inp.current_mem.get(n)]]
            assert job.g_on == {n: g for n, g, _, _ in rows} and job.g == sum(job.g_on.values())
            assert job.c_on == {n: c for n, _, c, _ in rows}
            assert job.mem_on == {n: m for n, _, _, m in rows if m and m > 0}
            gpus, cpg = tuple(job.g_on.values()), self._cpg_of(job)
            assert job.placed[:2] == (gpus, cpg) and job.best is job.placed[2]
            assert job.best == self._best_on(job, gpus, cpg)
            assert not (job.touched or job.forced or job.reason or job.detail or job.privileged)
            assert self.placed[job.id] is job and all(job.id in self.on_node[n] for n in job.g_on)

    monkeypatch.setattr(engine_mod.RubickEngine, "_place_current", placed)
    drive(seed, owners=True)
    assert counts["carried"] > 200, counts


def test_a_record_carried_over_that_no_longer_fits_is_made_again(monkeypatch):
    """The same inputs handed to an engine again, on the same nodes and then on nodes with fewer GPUs or one node gone:
    the records carried over are placed as they were where they fit, made again and placed the usual way (cut, or lost
    with their node) where not, and every outcome is that of a new engine, which carries nothing over."""
    oracle, models = from_modeler(MODELER)
    facts = lambda o: (o.job_id, o.shares, o.plan, o.throughput, o.reason, o.detail, o.pending)  # noqa: E731
    real = engine_mod.RubickEngine._place_current
    counts = {"carried": 0, "again": 0}

    def placed(self):
        carried = [j for j in self._awake if j.carried]
        real(self)
        counts["carried"] += len(carried)
        counts["again"] += sum(1 for j in carried if j.forced or j.reason == "node-lost")

    monkeypatch.setattr(engine_mod.RubickEngine, "_place_current", placed)
    rng = random.Random(7)
    for _ in range(60):
        nodes, jobs = _scenario(rng, models)
        jobs = [replace(j, changed_s=0.0) if j.running else j for j in jobs]  # held: they keep what they hold
        smaller = [engine_mod.NodeCap(n.name, n.gpus - (1 if i % 2 else 0), n.cpus, n.mem_gb)
                   for i, n in enumerate(nodes)]
        engine = make_policy("rubick", oracle=oracle, models=models).engine
        for layout in (nodes, nodes, smaller, nodes[1:]):
            fresh = make_policy("rubick", oracle=oracle, models=models).engine
            assert (sorted(facts(o) for o in engine.schedule(layout, jobs))
                    == sorted(facts(o) for o in fresh.schedule(layout, jobs)))
    assert counts["carried"] > 200 and counts["again"] > 20, counts


def test_a_records_slope_tables_are_those_of_what_it_asks_now():
    """`_tables` answers from the record's memo only what it would work out: the tables of the job's curve up to its
    want and down to its minimum as they are now, at its model's version (a refit, another want or minimum, or
    another reference asks the book again)."""
    from policy.curves import down_table, up_table

    _, core = drive(1, steps=6)
    engine = core.engine
    records = [j for j in engine.jobs.values() if j.version is not None and len(j.curve) > 3][:12]
    assert records
    answered = 0
    for job in records:
        for want, least in [(job.want_g, job.min_g), (1, 0), (len(job.curve) - 1, 0), (2, 1), (job.want_g, job.min_g)]:
            job.want_g, job.min_g = want, least
            kept = job.tables_memo is not None and job.tables_memo[0] is job.version and (want, least) in job.tables_memo[3]
            engine._tables(job)
            answered += kept
            assert job.up_tab == up_table(job.curve, want).tolist()
            assert job.down_tab == down_table(job.curve, least).tolist()
        job.ref *= 2  # another reference: its curve is another (as `_prepare` gives it), and so are its tables
        job.curve = job.curve / 2
        engine._tables(job)
        assert job.up_tab == up_table(job.curve, job.want_g).tolist()
        job.version = job.version + 10**9  # a refit: another number standing for its kind, the memo is not read
        engine._tables(job)
        assert job.tables_memo[0] is job.version
    assert answered >= len(records)  # the repeated asks were answered from the memo


@pytest.mark.parametrize("seed", [2])
def test_a_size_in_time_kept_through_a_round_is_the_one_worked_out_afresh(monkeypatch, seed):
    """Every repack of a round asks each guaranteed job on one node for the fewest GPUs with which it still ends in time
    (`_size_in_time`); the round keeps the answer per job, minimum, CPUs per GPU and reference. Each kept answer must be
    the one worked out again at that moment, and the run must publish what a run that keeps none publishes."""
    real = engine_mod.RubickEngine._size_in_time
    seen = {"kept": 0, "asked": 0}

    def checked(self, v):
        before = dict(self._sizes)
        answer = real(self, v)
        seen["asked"] += 1
        if v.id in before and before[v.id][0] == (v.min_g, self._cpg_of(v), v.ref):
            seen["kept"] += 1
            self._sizes.pop(v.id)
            assert real(self, v) == answer, v.id  # worked out afresh
        return answer

    monkeypatch.setattr(engine_mod.RubickEngine, "_size_in_time", checked)
    kept, _ = drive(seed, nodes=16, jobs=160, steps=30, cpus=12)
    assert seen["kept"] > 1000 and seen["kept"] < seen["asked"], seen

    def afresh(self, v):
        self._sizes.pop(v.id, None)
        return real(self, v)

    monkeypatch.setattr(engine_mod.RubickEngine, "_size_in_time", afresh)
    none_kept, _ = drive(seed, nodes=16, jobs=160, steps=30, cpus=12)
    assert sum(b"plan.decided" in b for b in kept) >= 10
    assert kept == none_kept


@pytest.mark.parametrize("seed,cpus", [(1, 96), (2, 12)])
def test_what_a_record_keeps_of_settling_an_allocation_is_what_settling_it_afresh_reads(monkeypatch, seed, cpus):
    """A running job asks what settling an allocation reads of the plan book (`_settle_memo`) round after round: of
    its allocation as it is (`_settled`), and of the larger ones its searches gather (`_refused_on`). Its record keeps
    the answers while its input, minimum, CPUs per GPU and model version are the same. Every answer given from the
    record must be the one worked out afresh at that moment, both kinds must be answered from it, and the run must
    publish what a run that keeps nothing publishes. With 12 CPUs a node, jobs hold fewer CPUs than their plans want
    and the CPUs per GPU change from round to round."""
    real = engine_mod.RubickEngine._settle_memo
    seen = {"own": 0, "gathered": 0, "asked": 0}

    def checked(self, job, place, cpus_per_gpu, whole=False):
        seen["asked"] += 1
        memo = job.settled_memo
        kept = memo is not None and (place, cpus_per_gpu) in memo[2]
        answer = real(self, job, place, cpus_per_gpu, whole)
        if kept and job.settled_memo is memo:  # answered from the record
            seen["own" if whole else "gathered"] += 1  # `_settled` on its allocation as it is, or `_refused_on`
            fresh = self._settle_entry(job, place, cpus_per_gpu)  # the shape worked out even where `_trim` gives back
            assert answer[:2] == fresh[:2], job.id
            if not (whole and answer[1]) or answer[2] is not engine_search._UNSET:  # left out only where not wanted
                assert answer[2] == fresh[2], job.id
        return answer

    monkeypatch.setattr(engine_mod.RubickEngine, "_settle_memo", checked)
    kept, _ = drive(seed, cpus=cpus)
    assert seen["own"] > 100 and seen["gathered"] > 10 and seen["own"] + seen["gathered"] < seen["asked"], seen

    monkeypatch.setattr(engine_mod.RubickEngine, "_settle_memo", engine_mod.RubickEngine._settle_entry)
    none_kept, _ = drive(seed, cpus=cpus)
    assert sum(b"plan.decided" in b for b in kept) >= 10
    assert kept == none_kept


@pytest.mark.parametrize("seed,cpus,mem_gb,lengths", [(1, 96, 1600.0, None), (2, 12, 1600.0, None),
                                                      (3, 96, 20.0, None), (1, 96, 1600.0, (100, 300, 10**5))])
def test_an_attempt_that_shrinks_jobs_for_a_change_the_restart_rule_refuses_is_undone_without_settling(
        monkeypatch, seed, cpus, mem_gb, lengths):
    """A running job's search that gathered GPUs, some of other jobs, is undone without settling where settling
    them would end on a plan whose gain does not pay the restarts the change costs (`_refused_on`): the job's own and
    one for each running job it shrank, as the restart rule (`_worth_it`) counts them. Each time it says so, settling
    succeeds, takes CPUs from no other job, and the restart rule refuses the change at that count; some of these the
    rule would let through at one restart. Where it says no, the attempt goes the long way. The events published are
    those of a core that settles every such attempt. With 12 CPUs a node, plans want CPUs other jobs hold; with 20 GB,
    host memory that is not there; with short jobs among long ones (`lengths`), gains between one restart and more."""
    real, attempt = engine_mod.RubickEngine._refused_on, engine_mod.RubickEngine._schedule_job
    seen = {"refused": 0, "not": 0, "by the restarts of jobs shrunk": 0}
    held_before: list[dict[str, int]] = []
    """each attempt under way: every job's GPUs as it began (the jobs its search shrank hold fewer now)"""

    def attempted(self, job, jr=None, only=None):
        held_before.append({j.id: j.g for j in self.jobs.values()})
        try:
            return attempt(self, job, jr, only)
        finally:
            held_before.pop()

    def checked(self, job, g_on, old, restarts=1):
        answer = real(self, job, g_on, old, restarts)
        if g_on is not job.g_on:  # free GPUs it would take (`_settles_back`)
            assert restarts == 1
            return answer
        shrunk = [j for j in self.jobs.values() if j.g < held_before[-1].get(j.id, 0)]
        assert restarts == 1 + sum(1 for j in shrunk if j.inp.running) and shrunk
        seen["refused" if answer else "not"] += 1
        if answer:
            seen["by the restarts of jobs shrunk"] += not real(self, job, g_on, old)
            _settles_refused(self, job, old, restarts)
        return answer

    monkeypatch.setattr(engine_mod.RubickEngine, "_refused_on", checked)
    monkeypatch.setattr(engine_mod.RubickEngine, "_schedule_job", attempted)
    shortcut, _ = drive(seed, cpus=cpus, mem_gb=mem_gb, lengths=lengths)
    assert seen["refused"] > 10 and seen["not"] > 0, seen
    assert seen["by the restarts of jobs shrunk"] > 0 or not lengths, seen
    monkeypatch.setattr(engine_mod.RubickEngine, "_schedule_job", attempt)

    monkeypatch.setattr(engine_mod.RubickEngine, "_refused_on",
                        lambda self, job, g_on, old, restarts=1: False if g_on is job.g_on else real(self, job, g_on,
                                                                                                     old))
    settled_each_time, _ = drive(seed, cpus=cpus, mem_gb=mem_gb, lengths=lengths)
    assert sum(b"plan.decided" in b for b in shortcut) >= 10
    assert shortcut == settled_each_time


def test_a_running_guarantee_is_carried_over_with_no_detail_but_the_one_its_quota_gives():
    """A running guarantee's record is carried over (`_prepare`) while nothing wrote it, or only the detail that its
    quota left it out (`quota_detail`), which the round's quotas write again. Any other detail (here the one a round
    writes where no placement meets a guarantee) makes the record again. Every round's outcomes are a fresh engine's,
    handed every input."""
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models, quotas={"t0": 16, "t1": 16}).engine
    kind = engine_mod.JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size)
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1600.0), engine_mod.NodeCap("n1", 8, 96, 1600.0)]
    jobs = {j.job_id: j for j in (
        engine_mod.JobIn("g", "t0", True, kind, 0, 8, 32, Plan(dp=8), current={"n0": (8, 32)},
                         current_plan=Plan(dp=8), running=True, remaining_iters=1e5, target_iters=1e5, changed_s=1e6),
        engine_mod.JobIn("b", "t1", False, kind, 1, 8, 32, Plan(dp=8), current={"n1": (8, 32)},
                         current_plan=Plan(dp=8), running=True, remaining_iters=1e6, changed_s=1e6))}

    def round_of(touched):
        out = {o.job_id: o for o in engine.schedule_changed(nodes, jobs, touched)}
        _as_fresh(engine, oracle, models, nodes, jobs, out)
        return engine.jobs["g"]

    round_of(None)
    assert round_of(set()).carried  # nothing written: carried over
    for detail, carried in (({"guarantee": "no placement meets it this round"}, False), ({"quota": "exceeded"}, True)):
        record = engine.jobs["g"]
        record.detail = detail  # as a round leaves it
        if carried:
            record.quota_detail = detail
        record = round_of(set())
        assert record.carried is carried and "guarantee" not in record.detail and record.detail is not detail


@pytest.mark.parametrize("seed", [1, 2])
def test_a_dormant_record_made_again_with_the_key_listed_stays_dormant(monkeypatch, seed):
    """A dormant record is kept while the kept index lists its own key object (`_keep_dormant`). A record made again
    whose key equals the one listed (the same parts) takes the listed object (`_patch_base`), so the next round keeps
    it dormant: none is ever made again only because its key is an equal copy of the one listed, and records made
    again do fall dormant and stay so. Without that, such a record would be made again every round it is held (1 and 8
    times in these two drives; on the 10x trace 18 of the 36 dormant records a round)."""
    real = engine_mod.RubickEngine._keep_dormant
    counts = Counter()

    def checked(self, ids, jobs, hold, refitted):
        index = getattr(self, "_index_base", None)
        before = dict(getattr(self, "_dormant", None) or {})
        told = set(ids)
        real(self, ids, jobs, hold, refitted)
        for job_id, record in before.items():
            if job_id in self._dormant:
                counts["kept"] += 1
                counts["kept after being made again"] += job_id in made_again
                continue
            listed = index.dkey.get(job_id) if index is not None else None
            counts["equal copy only"] += (job_id not in told and listed is not None and record.index_key is not None
                                          and listed is not record.index_key and listed == record.index_key)
        made_again.clear()
        made_again.update(ids)

    made_again: set = set()
    monkeypatch.setattr(engine_mod.RubickEngine, "_keep_dormant", checked)
    drive(seed, nodes=12, jobs=90, steps=40)
    assert counts["equal copy only"] == 0, counts
    assert counts["kept"] > 50 and counts["kept after being made again"] > 5, counts


def _takes_free_only_as_read(engine, job, order, floor, target, seen):
    """`_takes_free_only` the plain way: every node of the head, then every node of the tail (worked out as the attempt
    began), each read with the slope at the GPUs the job would hold by then; (the free GPUs taken, None), or (those
    taken before, the node where a job would be shrunk)."""
    up_tab, want, g, taken = job.up_tab, job.want_g, job.g, {}
    head = list(order.head())
    tail = (order.tail if order.tail is not None else engine._shrinkable(order.end, order.seen())[0]) if order.end else []
    for at, name in enumerate(head + list(tail)):
        take = min(engine.free_g[name], target - g)
        if take > 0:
            assert at < len(head)  # every node with a free GPU is in the head
            taken[name] = take
            g += take
            if target - g <= 0:
                return taken, None
        others = engine.on_node[name]
        if not others or (len(others) == 1 and job.id in others):
            continue
        limit = 0.0 if g >= want or g >= len(up_tab) else up_tab[g]
        if at >= len(head):
            seen["tail nodes"] += 1
        if (engine._beats(job, floor, limit) and not engine._none_below(name, job, {}, limit)
                and engine._lowest_slope_over_min(name, job, limit) is not None):
            seen["none on the tail" if at >= len(head) else "none on the head"] += 1
            return taken, name
    seen["taken after the tail" if tail else "taken"] += 1
    return taken, None


def _checked_against_reading(real, seen: Counter):
    """`_takes_free_only` that asserts, at every call, the answer and the flags it sets (`held_back`, `_skipped_held`)
    of `_takes_free_only_as_read`, the flags put back between the two."""
    def checked(self, job, order, floor, target):
        flags = (self.held_back, self._skipped_held)
        plain = _takes_free_only_as_read(self, job, order, floor, target, seen)
        plain_flags = (self.held_back, self._skipped_held)
        self.held_back, self._skipped_held = flags
        got = real(self, job, order, floor, target)
        assert got == plain and (self.held_back, self._skipped_held) == plain_flags, (job.id, got, plain)
        return got
    return checked


@pytest.mark.parametrize("seed,skip_from", [(1, 0), (2, 0), (3, 0), (1, 10**9)])
def test_what_a_running_job_would_take_of_free_gpus_is_what_reading_every_node_gives(monkeypatch, seed, skip_from):
    """`_takes_free_only` reads the tail only where its search could shrink a job: not at all where the job beats no
    job of the index at the slope the head left it, else only the nodes `_tail_reads` hands out (the lowest keys
    listed there, of the jobs not held once one was passed over, below the job's, and its own key's nodes). Its answer
    and what it sets (`held_back`, `_skipped_held`) are at every call those of reading every node of the head and the
    tail; and the core publishes what one that reads every node publishes."""
    seen = Counter()
    monkeypatch.setattr(engine_index, "_SKIP_FROM", skip_from)
    monkeypatch.setattr(engine_search._Search, "_takes_free_only",
                        _checked_against_reading(engine_search._Search._takes_free_only, seen))
    reading, _ = drive(seed, nodes=16, jobs=160, steps=30)
    assert seen["tail nodes"] > 100 and seen["none on the tail"] > 5 and seen["taken after the tail"] > 5, seen
    monkeypatch.setattr(engine_search._Search, "_takes_free_only",
                        lambda self, job, order, floor, target: _takes_free_only_as_read(self, job, order, floor,
                                                                                         target, Counter()))
    plain, _ = drive(seed, nodes=16, jobs=160, steps=30)
    assert reading == plain


def test_what_a_running_job_would_take_of_free_gpus_at_mixed_priorities_is_what_reading_every_node_gives(monkeypatch):
    """The same at random priorities, on small nodes where jobs hold GPUs on several of them (`_scenario`), every tail
    read the way a long one is: the nodes `_tail_reads` leaves out are only those where no job of a lower priority, or
    of the job's own and a slope below its own, is listed first."""
    oracle, models = from_modeler(MODELER)
    seen = Counter()
    monkeypatch.setattr(engine_index, "_SKIP_FROM", 0)
    monkeypatch.setattr(engine_search._Search, "_takes_free_only",
                        _checked_against_reading(engine_search._Search._takes_free_only, seen))
    rng = random.Random(11)
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    for _ in range(300):
        nodes, jobs = _scenario(rng, models)
        engine.schedule(nodes, jobs)
    assert seen["tail nodes"] > 50 and seen["none on the tail"] > 5, seen


def _held_by_both(engine, node, job, victim) -> tuple:
    """What a move between `job` and `victim` on `node` writes: both jobs' GPUs, CPUs and memory, and the node's."""
    return (dict(job.g_on), job.g, dict(job.c_on), dict(victim.g_on), victim.g, dict(victim.c_on), dict(victim.mem_on),
            engine.free_c[node], engine.free_m[node], engine.on_node[node])


_HIGH = (math.inf, math.inf)
"""A floor above every job's: each step's slope lowers it."""


def _one_at_a_time(engine, node, job, victim, target, floor, live) -> tuple:
    """What the search's steps on `node` do from here, one GPU at a time, each a look (`_lowest_slope_over_min`) and a
    move, for as long as the look picks `victim`: (GPUs taken, the floor after them from `floor` and from `_HIGH`, what
    both jobs and the node hold then, the flags). Undone after, the flags put back; `live` is read, not written."""
    flags = (engine.held_back, engine._skipped_held)
    reads = {n: [list(slot[0]), slot[1]] for n, slot in live.items()}
    jr, steps, low, high = records._Journal(), 0, floor, _HIGH
    while target - job.g > 0:
        v = engine._lowest_slope_over_min(node, job, math.inf if job.g < job.min_g else job.up(), None, reads)
        if v is not victim:
            break
        engine._move(jr, node, victim, job, 1)
        engine._shrunk(reads, victim, node)
        steps += 1
        if engine._over_min(victim):
            low = min(low, (victim.inp.priority, victim.down()))
            high = min(high, (victim.inp.priority, victim.down()))
    out = (steps, low, high, _held_by_both(engine, node, job, victim), (engine.held_back, engine._skipped_held))
    jr.undo()
    engine.held_back, engine._skipped_held = flags
    return out


def _at_once(engine, real, node, job, victim, target, floor, live) -> tuple:
    """The same read of `_more_from` (`real`): its count and floors, and what one move of that many leaves."""
    flags = (engine.held_back, engine._skipped_held)
    more, low = real(engine, node, job, victim, target, floor, live)
    high = real(engine, node, job, victim, target, _HIGH, live)[1]
    jr = records._Journal()
    if more:
        engine._move(jr, node, victim, job, more)
    out = (more, low, high, _held_by_both(engine, node, job, victim), flags)
    jr.undo()
    return out


def _checked_steps(real, seen: Counter):
    """`_more_from` that asserts, at every call that takes GPUs, what the search's one-GPU-at-a-time steps do from the
    same state: they take that many from the same job before the look finds none or another, end on the same floor
    (and on the same from a floor above every job's) and the same flags, and leave both jobs and the node as the one
    move of that many does."""
    def checked(self, node, job, victim, target, floor, live):
        more, after = real(self, node, job, victim, target, floor, live)
        seen["asked"] += 1
        if more:
            seen["taken at once"] += 1
            seen["GPUs"] += more
            seen["of a lower priority"] += victim.inp.priority < job.inp.priority
            seen["off the node"] += more == victim.g_on[node]
            at_once = _at_once(self, real, node, job, victim, target, floor, live)
            steps = _one_at_a_time(self, node, job, victim, target, floor, live)
            seen["a floor lowered"] += steps[2] != _HIGH
            assert steps == at_once, (job.id, victim.id, node)
        return more, after
    return checked


@pytest.mark.parametrize("seed,cpus,mem_gb", [(1, 96, 1600.0), (2, 12, 1600.0), (3, 96, 20.0), (4, 96, 1600.0)])
def test_gpus_a_search_takes_from_the_only_job_on_a_node_at_once_are_those_it_takes_one_at_a_time(
        monkeypatch, seed, cpus, mem_gb):
    """Where the only job a search could shrink on a node is the one it just took a GPU from, the next steps there
    are worked out from the two jobs' tables and taken in one move (`_more_from`): at every call, the steps one GPU at
    a time take as many, end on the same floor and flags, and leave the same GPUs, CPUs and memory (12 CPUs a node:
    jobs hold fewer CPUs than GPUs want; 20 GB: memory given back as a job leaves a node). The core publishes what
    one that takes one GPU at a time publishes."""
    seen = Counter()
    monkeypatch.setattr(engine_search._Search, "_more_from", _checked_steps(engine_search._Search._more_from, seen))
    at_once, _ = drive(seed, nodes=16, jobs=160, steps=30, cpus=cpus, mem_gb=mem_gb)
    assert seen["taken at once"] > 20 and seen["GPUs"] > seen["taken at once"] and seen["off the node"] > 0, seen
    assert seen["a floor lowered"] > 0, seen
    monkeypatch.setattr(engine_search._Search, "_more_from", lambda self, node, job, victim, target, floor, live:
                        (0, floor))
    one_at_a_time, _ = drive(seed, nodes=16, jobs=160, steps=30, cpus=cpus, mem_gb=mem_gb)
    assert sum(b"plan.decided" in b for b in at_once) >= 10
    assert at_once == one_at_a_time


def test_gpus_taken_at_once_at_mixed_priorities_are_those_taken_one_at_a_time(monkeypatch):
    """The same at random priorities, on small nodes where jobs hold GPUs on several of them (`_scenario`): a victim
    of a lower priority gives GPUs whatever its slope. After each round, every pair of jobs on a node (one at or over
    its minimum, the other the only other job there) is asked too, at the most GPUs the node allows: a job of a higher
    priority, or one held, gives none; the others what the steps one at a time take."""
    oracle, models = from_modeler(MODELER)
    seen = Counter()
    real = engine_search._Search._more_from
    monkeypatch.setattr(engine_search._Search, "_more_from", _checked_steps(real, seen))
    rng = random.Random(12)
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    for _ in range(300):
        nodes, jobs = _scenario(rng, models)
        engine.schedule(nodes, jobs)
        for where, there in engine.on_node.items():
            if len(there) != 2:
                continue
            for a, b in (sorted(there), sorted(there)[::-1]):
                grows, victim = engine.jobs[a], engine.jobs[b]
                if grows.g < grows.min_g:
                    continue
                target = grows.g + victim.g_on.get(where, 0)
                steps = _one_at_a_time(engine, where, grows, victim, target, _HIGH, {})
                assert steps == _at_once(engine, real, where, grows, victim, target, _HIGH, {}), (a, b)
                seen["pairs"] += 1
                seen["pairs taken from"] += steps[0] > 0
                seen["a higher priority"] += victim.inp.priority > grows.inp.priority
    assert seen["taken at once"] > 10 and seen["of a lower priority"] > 5, seen
    assert seen["pairs taken from"] > 10 and seen["a higher priority"] > 10, seen
