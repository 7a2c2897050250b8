"""The training contract (docs/workloads.md): what a launcher hands every rank, and the few calls the
training code makes back. The same for local processes and Kubernetes pods.

Launcher side (pure): `run_record` is the run file's content, `contract_env` the `RUBICK_*`
variables that point the code at it. Training side:

    job = TrainingJob.from_env()                    # plan, batch sizes, DeepSpeed config, folders
    start = my_resume(job.checkpoint_dir)           # 0 when the folder is empty
    reporter = job.reporter()                       # metrics.iteration, rank 0 only
    for it in range(start, job.target_iterations):
        if job.should_stop():                       # the agent asked (reconfiguration, preemption)
            my_save(job.checkpoint_dir, it); job.checkpointed(it); break
        ...one iteration...
        job.iteration_done(it + 1)
    else:
        job.completed(job.target_iterations)

A stop is asked by a file (`RUBICK_STOP_FILE`, local), by the pod annotation `rubick.io/stop`
(Kubernetes, seen through the downward-API file `RUBICK_PODINFO`), by SIGTERM (both: a drained node,
`kubectl delete`), or by the agent's lease running out (`agents.lease`). The status the code writes
(`RUBICK_STATUS_FILE`; in a pod also the termination message) is how the launcher tells a checkpoint
from a crash.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.events import NodeShare, Plan, build
from controlplane.events.schema import to_plain

from . import jit_ops, lease
from .plan_config import PlanError, deepspeed_config, micro_batch_size

PREFIX = "RUBICK_"
JOB_ID, NODE, ATTEMPT = "RUBICK_JOB_ID", "RUBICK_NODE", "RUBICK_ATTEMPT"
RUN_FILE, PLAN = "RUBICK_RUN_FILE", "RUBICK_PLAN"
DEEPSPEED_CONFIG = "RUBICK_DEEPSPEED_CONFIG"
CHECKPOINT_DIR = "RUBICK_CHECKPOINT_DIR"
STOP_FILE, PODINFO = "RUBICK_STOP_FILE", "RUBICK_PODINFO"
STATUS_FILE, READY_FILE, TERMINATION_LOG = "RUBICK_STATUS_FILE", "RUBICK_READY_FILE", "RUBICK_TERMINATION_LOG"
GLOBAL_BATCH, MICRO_BATCH, GA_STEPS = "RUBICK_GLOBAL_BATCH_SIZE", "RUBICK_MICRO_BATCH_SIZE", "RUBICK_GA_STEPS"
TARGET_ITERATIONS = "RUBICK_TARGET_ITERATIONS"
NATS_URL = "RUBICK_NATS_URL"
STOP_ANNOTATION = "rubick.io/stop"
"""The pod annotation the Kubernetes launcher sets to ask for checkpoint-and-exit."""

STATES = ("running", "checkpointed", "completed")


@dataclass(frozen=True)
class Files:
    """Where one attempt's contract files are, as the training processes see them."""

    run_file: str
    deepspeed_config: str
    checkpoint_dir: str
    status_file: str
    ready_file: str
    stop_file: str | None = None
    podinfo: str | None = None
    termination_log: str | None = None


def local_files(job_dir: str | Path, attempt: int, checkpoint_dir: str | Path | None = None) -> Files:
    """The contract files of a local launch, all in the job's folder (the checkpoint folder may be the
    workload's own host path)."""
    d = Path(job_dir)
    return Files(run_file=str(d / f"run-a{attempt}.json"), deepspeed_config=str(d / f"deepspeed-a{attempt}.json"),
                 checkpoint_dir=str(checkpoint_dir or d), status_file=str(d / "status.json"),
                 ready_file=str(d / "ready"), stop_file=str(d / "control" / "stop"))


def run_record(job_id: str, model_type: str, plan: Plan, allocation: tuple[NodeShare, ...], share: NodeShare,
               node: str, attempt: int, global_batch_size: int, target_iterations: int, nats_url: str | None,
               job_dir: str, **extra: Any) -> dict[str, Any]:
    """The run file: everything about this attempt, for the training code (and the example trainer)."""
    gpus = [s.gpus for s in allocation if s.gpus > 0]
    try:
        micro = micro_batch_size(plan, global_batch_size)
    except PlanError:
        micro = None
    return {**extra, "job_id": job_id, "model_type": model_type, "plan": to_plain(plan),
            "global_batch_size": global_batch_size, "micro_batch_size": micro,
            "target_iterations": target_iterations, "job_dir": job_dir, "node": node, "attempt": attempt,
            "gpus_per_node": gpus, "nodes": len(gpus),
            "cpus_per_gpu": max(1, share.cpus // share.gpus) if share.cpus and share.gpus else None,
            "nats_url": nats_url}


def deepspeed_file_content(run: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed configuration the launcher writes beside the run file."""
    return deepspeed_config(build(Plan, run["plan"]), int(run["global_batch_size"]), lr=float(run.get("lr", 3e-3)))


def contract_env(run: dict[str, Any], files: Files, lease_s: float) -> dict[str, str]:
    """The `RUBICK_*` environment of every rank."""
    plan = run["plan"]
    env = {JOB_ID: run["job_id"], NODE: run["node"], ATTEMPT: str(run["attempt"]),
           RUN_FILE: files.run_file, PLAN: json.dumps(plan, sort_keys=True, separators=(",", ":")),
           DEEPSPEED_CONFIG: files.deepspeed_config, CHECKPOINT_DIR: files.checkpoint_dir,
           STATUS_FILE: files.status_file, READY_FILE: files.ready_file,
           GLOBAL_BATCH: str(run["global_batch_size"]), GA_STEPS: str(plan.get("ga_steps", 1)),
           TARGET_ITERATIONS: str(run["target_iterations"]), lease.LEASE_ENV: f"{lease_s:g}"}
    if run.get("micro_batch_size") is not None:
        env[MICRO_BATCH] = str(run["micro_batch_size"])
    if run.get("nats_url"):
        env[NATS_URL] = run["nats_url"]
    for name, value in ((STOP_FILE, files.stop_file), (PODINFO, files.podinfo),
                        (TERMINATION_LOG, files.termination_log)):
        if value:
            env[name] = value
    return env


def parse_status(text: str | None) -> dict[str, Any]:
    """A status document (status file or termination message); {} when unreadable."""
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) and doc.get("state") in STATES else {}


def annotation_set(podinfo_text: str, key: str = STOP_ANNOTATION) -> bool:
    """Whether the downward-API annotations file (lines `key="value"`) holds `key`."""
    return any(line.split("=", 1)[0].strip() == key for line in podinfo_text.splitlines())


# --- the training side -----------------------------------------------------------------------------

_SIGTERM = {"seen": False}


def _on_sigterm(signum: int, frame: Any) -> None:
    _SIGTERM["seen"] = True


@dataclass
class TrainingJob:
    """The contract as training code sees it (built from the environment the launcher set)."""

    run: dict[str, Any]
    env: dict[str, str]
    rank: int = 0
    status: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, *, run_file: str | Path | None = None,
                 catch_sigterm: bool = True) -> "TrainingJob":
        """From the launcher's environment; with `run_file` and no `RUBICK_RUN_FILE` set (a run started by
        hand, `examples.trainer.runner`), the files are the job folder's defaults (`local_files`). Where the
        training code has imported DeepSpeed, its JIT op builds are guarded (`agents.jit_ops`)."""
        env = dict(os.environ if environ is None else environ)
        if RUN_FILE not in env and run_file is not None:
            doc = json.loads(Path(run_file).read_text())
            files = local_files(doc["job_dir"], int(doc.get("attempt", 1)))
            env.update({RUN_FILE: str(run_file), CHECKPOINT_DIR: files.checkpoint_dir, STATUS_FILE: files.status_file,
                        STOP_FILE: files.stop_file or ""})
        if RUN_FILE not in env:
            raise RuntimeError(f"{RUN_FILE} is not set: this code runs under a Rubick launcher (docs/workloads.md)")
        run = json.loads(Path(env[RUN_FILE]).read_text())
        if catch_sigterm:
            try:
                signal.signal(signal.SIGTERM, _on_sigterm)
            except ValueError:  # not the main thread: the launcher's other ways to ask still work
                pass
        if "deepspeed" in sys.modules:  # a rank killed while DeepSpeed builds an op must not stall the next
            jit_ops.guard_builds()
        job = cls(run, env, int(env.get("RANK", "0")))
        job.status = {"state": "running", "attempt": run.get("attempt", 1), "plan": job.plan.code(),
                      "iteration": 0, "target": job.target_iterations, "launched_at": time.time(),
                      "first_iteration_at": None}
        return job

    # what the plan says
    @property
    def plan(self) -> Plan:
        return build(Plan, self.run["plan"])

    @property
    def global_batch_size(self) -> int:
        return int(self.run["global_batch_size"])

    @property
    def micro_batch_size(self) -> int:
        return micro_batch_size(self.plan, self.global_batch_size)

    @property
    def target_iterations(self) -> int:
        return int(self.run["target_iterations"])

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.env[CHECKPOINT_DIR])

    def deepspeed_config(self) -> dict[str, Any]:
        return json.loads(Path(self.env[DEEPSPEED_CONFIG]).read_text())

    def reporter(self, **kw: Any):
        """The `agents.reporter.Reporter` of this attempt (publishing from rank 0 only)."""
        from .reporter import Reporter
        return Reporter.from_run(self.run if self.rank == 0 else {**self.run, "nats_url": None}, **kw)

    # asked to stop?
    def stop_reason(self) -> str | None:
        """Why to checkpoint and exit now ("agent", "sigterm", "lease expired"), or None. Call it on every
        rank and agree (all-reduce) when ranks must stop at the same iteration."""
        if _SIGTERM["seen"]:
            return "sigterm"
        stop = self.env.get(STOP_FILE)
        if stop and Path(stop).exists():
            return "agent"
        podinfo = self.env.get(PODINFO)
        if podinfo:
            try:
                if annotation_set(Path(podinfo).read_text()):
                    return "agent"
            except OSError:
                pass
        job_dir = self.run.get("job_dir")
        if job_dir and lease.lease_expired(Path(job_dir)):
            return "lease expired"
        return None

    def should_stop(self) -> bool:
        return self.stop_reason() is not None

    # telling the launcher (rank 0 writes; other ranks' calls do nothing)
    def begin(self, iteration: int, **extra: Any) -> None:
        """Running from `iteration` (0, or where the checkpoint left off)."""
        self.status.update(extra, state="running", iteration=iteration, started_iteration=iteration)
        self._write(final=False)

    def iteration_done(self, iteration: int, **extra: Any) -> None:
        now = time.time()
        first = self.status.get("first_iteration_at") is None
        self.status.update(extra, iteration=iteration, updated_at=now,
                           first_iteration_at=self.status.get("first_iteration_at") or now)
        self._write(final=False)
        if first and self.rank == 0 and self.env.get(READY_FILE):
            Path(self.env[READY_FILE]).write_text(str(now))

    def checkpointed(self, iteration: int, stopped_by: str | None = None, **extra: Any) -> None:
        self.status.update(extra, state="checkpointed", iteration=iteration, checkpointed_at=time.time(),
                           stopped_by=stopped_by or self.stop_reason() or "agent")
        self._write(final=True)

    def failed(self, reason: str, **extra: Any) -> None:
        """The training code cannot go on (a plan it cannot run, a checkpoint it cannot use): say why; the
        launcher puts it in `job.failed`. Call it on the ranks that hit the error (rank 0 writes)."""
        self.status.update(extra, state="failed", error=str(reason)[:2000], failed_at=time.time())
        self._write(final=True)

    def completed(self, iteration: int, **extra: Any) -> None:
        self.status.update(extra, state="completed", iteration=iteration, completed_at=time.time())
        self._write(final=True)

    def _write(self, final: bool) -> None:
        if self.rank != 0:
            return
        text = json.dumps(self.status)
        path = Path(self.env[STATUS_FILE])
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        term = self.env.get(TERMINATION_LOG)
        if final and term:
            try:  # the kubelet's bind-mounted file: written in place, read back into the pod's status
                with open(term, "w") as f:
                    f.write(text[:4000])
            except OSError:
                pass
