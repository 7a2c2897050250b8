"""The end of the Rubick engine's round: each job's outcome (its shares, plan, predicted throughput, reason and
pending reason), made from where the round left it."""

from __future__ import annotations

import math

import numpy as np

from controlplane.events import Plan
from modeler.configs import ConfigError

from .curves import Best, JobKind
from .plans import canonical
from .records import Outcome, _Job


class _Outcomes:
    """Part of `RubickEngine`: the round's outcomes."""

    def _least(self, job: _Job) -> int:
        """The fewest GPUs on which some plan of the job fits in memory (0: none on this cluster)."""
        kind = job.inp.kind
        key = (id(kind), job.cpg)  # the book's memo, read once per kind object and CPUs per GPU in a round
        least = self._least_seen.get(key)
        if least is None:
            def first() -> int:
                hit = np.flatnonzero(job.curve > 0)
                return int(hit[0]) if len(hit) else 0
            least = self._least_seen[key] = self.book.memo(kind, ("least", job.cpg), first)
        return least

    def _pending(self, job: _Job, gpus: int, why: str | None = None) -> tuple[str, int, dict[str, str]] | None:
        """Why the job holds no GPUs, or fewer than it asked for and could use; None when it does not."""
        if not self.reasons or gpus > 0 and gpus >= min(job.inp.requested_gpus, job.want_g):
            return None
        needs = max(1, job.min_g) if job.privileged else max(1, self._least(job))
        quota = job.detail.get("quota")
        if job.inp.guaranteed and quota is not None and not job.privileged:
            return "quota", needs, {"quota": str(self._quota(job)),
                                    "quota_used": str(self._quota_used.get(job.inp.tenant, 0))}
        return why or self.why.get(job.id, "no-gpus"), needs, {}

    def _finish(self, job: _Job) -> Outcome:
        if job.g <= 0:
            reason = job.reason if job.reason in ("preempted", "node-lost") else (job.reason or "queued")
            if job.inp.current and reason == "queued":
                reason = "preempted"
            pending, last = self._pending(job, 0), job.idle
            if last is not None and last.reason == reason and last._detail is job.detail and last.pending == pending:
                return last
            job.idle = Outcome(job.id, {}, None, 0.0, reason, job.detail, pending)
            job.idle_plain = (reason == "queued" and not job.detail and pending is not None and pending[0] == "no-gpus"
                              and not pending[2])
            return job.idle
        placed = job.placed
        if not job.touched:  # it holds what it was placed on as the round began: the same best plan
            memo = job.finish_memo
            if (memo is not None and memo[0] is placed and memo[1] is job.detail and memo[2] == job.privileged
                    and not job.reason and not job.forced and job.running_memo[0] is memo[3]):
                # placed as when its last outcome was made, flag and detail the same: the same plan (the margins of a
                # guarantee carried over are the same) and shares; only its quota state and pending reason may move
                rm = job.running_memo
                quota = None
                if job.inp.guaranteed and not job.privileged and "guarantee" not in job.detail:
                    quota = "exceeded" if self._quota(job) else "none"
                if quota == rm[4] and self._pending(job, memo[4]) == rm[5]:
                    return memo[3]
            gpus, cpg, best = placed
        else:
            cpg, gpus = self._cpg_of(job), tuple(job.g_on.values())
            if placed is not None and placed[0] == gpus and placed[1] == cpg:
                best = placed[2]  # it holds what it held as the round began: the same best plan
            else:
                best = self._best_on(job, gpus, cpg)
        if job.privileged:
            best = self._guarded(job, best, gpus)
        if best.plan is None:
            return Outcome(job.id, {}, None, 0.0, "preempted", {"why": "no plan fits the placement left"},
                           self._pending(job, 0, "no-fit"))
        plan = best.plan
        cur = job.inp.current_plan
        if (cur is not None and plan is not cur and not job.forced and job.inp.running and plan != cur
                and self._same_alloc(job)):
            # the current plan on the whole allocation (the best plan may leave GPUs unused): asked of the oracle once
            # per model version, placement and CPUs (a job kept on its plan asks the same every round)
            place = canonical(gpus)
            t_old = self.book.memo(job.inp.kind, ("current", place, cpg, cur),
                                   lambda: self._iter_time(job.inp.kind, place, cpg, cur))
            gbs = job.inp.kind.global_batch
            held = job.id in self.held  # changed a moment ago: keeps its plan whatever it would gain
            if math.isfinite(t_old) and (held or
                                         job.inp.remaining_iters * (t_old - gbs / best.throughput) <= self.restart_cost_s):
                self.held_back = self.held_back or held
                kept = Best(gbs / t_old, cur, place)
                return self._outcome(job, cur, kept.throughput, kept)
        out = self._outcome(job, plan, best.throughput, best)
        if not job.touched and not job.reason and not job.forced and (cur is None or plan is cur or plan == cur):
            # what the next round's `_finish` may give again while the record is placed the same (above)
            job.finish_memo = (placed, job.detail, job.privileged, out, sum(best.placement))
        return out

    def _iter_time(self, kind: JobKind, placement: tuple[int, ...], cpg: int, plan: Plan) -> float:
        """The oracle's seconds per iteration of `plan` on `placement` (inf: it cannot tell, or the plan does not run
        there)."""
        try:
            times = self.book.oracle.evaluate(kind.model, kind.global_batch, placement, cpg, [plan])[0]
        except ConfigError:
            return math.inf
        return float(times[0]) if len(times) else math.inf

    @staticmethod
    def _same_alloc(job: _Job) -> bool:
        """Whether the job holds exactly the GPUs and CPUs it held before the round."""
        current = job.inp.current
        c_on = job.c_on
        if len(job.g_on) != sum(1 for gc in current.values() if gc[0] > 0):
            return False
        for n, g in job.g_on.items():
            if current.get(n) != (g, c_on.get(n, 0)):
                return False
        return True

    def _outcome(self, job: _Job, plan: Plan, tput: float, best: Best) -> Outcome:
        g_on, c_on, mem_on = job.g_on, job.c_on, job.mem_on
        reason = job.reason or ("start" if not job.inp.current else "keep")
        quota = None
        if job.inp.guaranteed and not job.privileged and "guarantee" not in job.detail:
            quota = "exceeded" if self._quota(job) else "none"  # runs as best-effort
        pending = self._pending(job, sum(best.placement))
        memo = job.running_memo
        if memo is not None and memo[6] == best.placement and memo[7] == g_on and memo[8] == c_on and memo[9] == mem_on:
            # the last outcome it gave holding GPUs, on the same GPUs, CPUs and memory: given again if every other
            # part of this one is the same; else the new one takes its shares (and plan, where equal) as they are,
            # objects the service finds equal at once (a held job's pending reason comes and goes as GPUs are freed
            # and taken)
            _, m_plan, m_tput, m_reason, m_quota, m_pending, _, m_g, m_c, m_mem, m_detail, m_curve, m_ref = memo
            if m_plan is plan or m_plan == plan:
                if (m_tput == tput and m_reason == reason and m_quota == quota and m_pending == pending
                        and m_detail is job.detail and m_curve is job.curve and m_ref == job.ref):
                    return memo[0]
                plan = m_plan
            shares = memo[0].shares
        else:
            m_g, m_c, m_mem = dict(g_on), dict(c_on), dict(mem_on)
            if len(g_on) == 1:  # one node: the placement's one entry is its share there
                [n] = g_on
                g = best.placement[0]
                shares = {n: (g, c_on.get(n, 0), round(mem_on.get(n, 0.0), 3))} if g > 0 else {}
            else:
                used = zip(sorted(g_on, key=lambda n: (-g_on[n], n)), best.placement)
                shares = {n: (g, c_on.get(n, 0), round(mem_on.get(n, 0.0), 3)) for n, g in used if g > 0}
        # made only when read (`Outcome.detail`); a job's detail is replaced, never changed
        later = (job.detail, job.curve, job.g, job.ref, tput, quota)
        out = Outcome(job.id, shares, plan, tput, reason, later, pending)
        job.running_memo = (out, plan, tput, reason, quota, pending, best.placement, m_g, m_c, m_mem, job.detail,
                            job.curve, job.ref)
        return out
