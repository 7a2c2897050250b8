"""The Rubick engine's dormant records: running best-effort jobs held by the restart rule, left out of the passes of a
round that would make them again as they are.

A running job changed less than the hold ago keeps its allocation against every best-effort reason (`hold_s`). In a
steady round many jobs awake are such: at 1,024 GPUs about 125 of 275. A round made each again (`_prepare`, carried
over), listed it among the jobs held, placed and indexed it from the kept placement and index, sorted its queue key,
tried it (held: it answers at once) and finished it (its last outcome again, most often). Only its queue turn and its
outcome can differ from the last round's: whether GPUs are free, or held by a job it could take them from, at its turn
(its pending reason, `held` or `no-gpus`, and the round's `held_back`), and whatever an attempt of a guarantee under
its minimum takes from it.

So a record the last round carried over and left as it found it, held, holding GPUs at or over its minimum, is kept
dormant (`_dormant`) while its input is the same object (the round is not told it changed), its model is not refitted,
it is still held, and the kept placement and index list it as it is. A round then does not make it, nor walk it when
it places and indexes the jobs awake (it is in the kept placement and index already), but counts it among the jobs held,
gives its queue key its turn, and finishes it. Where the placement or the index is made whole, or slopes that are not
numbers make the index one job at a time, the dormant records are woken first (`_wake_dormant`): among the jobs awake
in the order those were made, as `_prepare` would have carried them.

A caller that keeps the inputs between rounds (`PolicyCore`) may leave some dormant records' inputs as an earlier round
left them (`resting`): the fields that follow the clock are not brought forward while the round's time is surely
under the hold since their last change. A round reads none of those fields of a resting record before it asks the
caller for them (`bring_forward`): where it makes the record again, wakes it, tries it or finishes it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from .engine_guarantees import _made_order
from .records import _Job


class _Dormant:
    """Part of `RubickEngine`: its dormant records (it reads the round's state the engine keeps)."""

    resting: Collection[str] = frozenset()
    """ids of dormant records whose inputs the caller did not bring forward for this round: their fields that follow
    the clock (`remaining_iters`, `elapsed_s`, `changed_s`, `recent_changes`, `ref_iter_s`) are as an earlier round
    set them, and the caller promises that each job's seconds since its last change are under its hold (`rest_hold`
    of its changes within `hold_backoff_s`, as they are at the round's time). Set by the caller before a round, with
    `bring_forward`."""
    bring_forward: Callable[[list[str]], None] | None = None
    """the caller's: brings forward the inputs of the resting jobs named, and takes them out of `resting`"""
    fell_dormant: list[str] = []  # noqa: RUF012 (replaced, never written)
    """after a round: the jobs whose records fell dormant in it, or were dormant and had their inputs brought forward
    (the caller may let their inputs rest); never written, only replaced"""

    def is_dormant(self, job_id: str) -> bool:
        """Whether the job's record is dormant after the last round."""
        return job_id in getattr(self, "_dormant", ())

    def _bring_forward(self, ids: Iterable[str]) -> None:
        """Before a round reads the fields that follow the clock of these jobs: those resting, brought forward."""
        resting = self.resting
        ask = [job_id for job_id in ids if job_id in resting]
        if ask:
            self.bring_forward(ask)
            self._forwarded += ask

    def _keep_dormant(self, ids: set[str], jobs, hold: float, refitted: bool) -> None:
        """At a round told which inputs changed, before its records are made: the last round's dormant records that
        stay so (`_dormant`); the others are added to `ids`, to be made again. `refitted`: a model may have been
        refitted since the last round (every dormant record's model version is read).

        A record dormant through the last round too (not one that fell dormant at its end, `_fresh_dormant`) is listed
        by the kept placement and index as that round found it: a round leaves a dormant record's rows and key where
        they are (`_patch_placement`, `_patch_base`; an index made whole lists its key, a placement made whole wakes
        it). Where its input also rests (the caller promises it is the same object and held) and no model was
        refitted, only whether a round was told of it is left to look at."""
        ids.update(getattr(self, "_roused", ()))  # each written by the last round, which asked for its input
        dormant = getattr(self, "_dormant", None)
        resting = self.resting
        if not dormant:
            self._dormant = {}
            return
        place, index = getattr(self, "_place_base", None), getattr(self, "_index_base", None)
        if place is None or index is None:
            ids.update(dormant)
            self._bring_forward(dormant)
            self._dormant = {}
            return
        rows, dkey, listed_held = place.rows, index.dkey, index.held
        backoff = self.hold_backoff_s > 0
        versions, version_of, backoff_of = self._versions, self._version, self._backoff
        fresh = self._fresh_dormant
        woke: list[str] = []
        for job_id, job in dormant.items():
            if job_id in ids:
                woke.append(job_id)
                continue
            if job_id in resting and not refitted and job_id not in fresh:
                continue  # as the last round kept it
            inp = job.inp
            key = job.index_key
            # `_version` and `_backoff` read inline where they answer at once (a kind asked this round, a job changed
            # at most once within the window): 36 dormant records a round on the 10x trace. A resting job is held, as
            # the caller promises (its `changed_s` is not brought forward)
            if not (jobs.get(job_id) is inp and inp.running and inp.current
                    and (versions.get(id(inp.kind)) or version_of(inp.kind)) is job.version
                    and (job_id in resting
                         or inp.changed_s < (hold * backoff_of(inp) if backoff and inp.recent_changes > 1 else hold))
                    and job.current_rows[0] is inp.current and job.current_rows[1] is inp.current_mem
                    and rows.get(job_id) is job.current_rows[2]
                    and (dkey.get(job_id) is key and job_id in listed_held if key is not None
                         else job_id not in dkey)):
                ids.add(job_id)
                woke.append(job_id)
        if woke:
            for job_id in woke:
                del dormant[job_id]  # the others keep their order
            self._bring_forward(woke)
        self._dormant = dormant

    def _wake_dormant(self) -> None:
        """The dormant records made jobs awake for the rest of the round, in the order the jobs awake were made in:
        what `_prepare` would have made of them (carried over)."""
        dormant = self._dormant
        if dormant:
            self._bring_forward(dormant)
            self._awake.extend(dormant.values())
            self._awake.sort(key=_made_order)
            self._dormant = {}

    def _fall_dormant(self) -> None:
        """At a round's end: the records the next round may leave dormant. Those carried over (or dormant) and left as
        found, best-effort, held, placed whole on GPUs at or over their minimum: the next round's `_prepare` would carry
        each over again while its input, model and hold are the same (`_keep_dormant` checks those).

        A dormant record the round did not finish was not written (every record an attempt writes is `touched`, and
        finished): it stays dormant as it is. Those it finished are looked at again, and the jobs awake."""
        held, dormant = self.held, self._dormant
        roused: list[str] = []  # dormant this round, made again by the next (they are not among the jobs awake)
        fell: list[str] = []
        for group in (self._finished_dormant, self._awake):
            for job in group:
                if (job.carried and not job.touched and job.g and job.g >= job.min_g and job.id in held
                        and not job.inp.guaranteed and not job.privileged and not job.forced and not job.reason
                        and not job.detail and job.whole and job.placed is not None
                        and job.current_rows is not None and job.version is not None):
                    if group is self._awake:
                        dormant[job.id] = job
                        fell.append(job.id)
                    if job.quiet is None:  # else worked out as it was last finished, and nothing written since
                        job.quiet = self._quiet(job)
                elif group is not self._awake:
                    del dormant[job.id]
                    roused.append(job.id)
        self._fresh_dormant = set(fell)
        fell += [job_id for job_id in self._forwarded if job_id in dormant]
        self._dormant, self._roused, self.fell_dormant = dormant, roused, fell

    def _quiet(self, job: _Job) -> bool | str | None:
        """What `_finish` reads of a record holding GPUs, as it was just finished, while nothing writes it and it is
        carried over (or dormant) with the same flag of a guarantee kept (`quiet_priv`): True where it gives its last
        outcome again whatever the round (no pending reason: it holds as many GPUs as it asks for), the pending reason
        of its last outcome where it gives it again while the round gives that reason (`why`, `no-gpus` where none),
        None where it is to be finished (its last outcome not made from the memo `_finish` reads, or a guarantee
        running as best-effort, whose quota state the round works out)."""
        job.quiet_priv = job.privileged
        memo, rm = job.finish_memo, job.running_memo
        if (memo is None or rm is None or memo[0] is not job.placed or memo[1] is not job.detail
                or memo[2] != job.privileged or rm[0] is not memo[3] or job.given is not memo[3] or rm[4] is not None
                or job.reason or job.forced):
            return None
        pending = rm[5]
        if not self.reasons or memo[4] > 0 and memo[4] >= min(job.inp.requested_gpus, job.want_g):
            return True if pending is None else None
        needs = max(1, job.min_g) if job.privileged else max(1, self._least(job))
        if pending is None or pending[2] or pending[1] != needs:
            return None
        return pending[0]
