"""Launchers: start, stop, watch and find a job's training processes on this node.

`Launcher` is the interface the agent shell uses; `LocalLauncher` runs torchrun (one process
per device) in its own process group, bound to the allocated CPU cores, with its log, run file,
status and checkpoint in `<state_dir>/jobs/<job_id>/`, and the job's traffic class in its
environment (`agents.traffic`; the workload's own env wins). Training processes do not depend on the
agent: when the agent dies they go on, and a restarted agent finds them with `find()`; if none
does within the training lease (`agents.lease`), they checkpoint and exit. A job on one node
listens on the loopback interface only (`agents.torchrun`).
A Kubernetes launcher (pods instead of processes) fits the same interface.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from controlplane.events import NodeShare, Plan, build
from controlplane.events.schema import to_plain

from . import contract, lease
from .core import Exited, Fact, FirstIteration, Found, Launch
from .plan_config import PlanError, torchrun_args, torchrun_env, trainer_command, warm_modules
from .traffic import DEFAULT as DEFAULT_TRAFFIC_CLASSES
from .traffic import TrafficClasses, traffic_env

REPO = Path(__file__).resolve().parent.parent
TRAINER = REPO / "examples" / "trainer" / "train.py"
LOG_TAIL_LINES = 40


class LaunchError(RuntimeError):
    pass


class Launcher(Protocol):
    def launch(self, action: Launch) -> None: ...
    def request_stop(self, job_id: str, attempt: int) -> None: ...
    def kill(self, job_id: str) -> None: ...
    def poll(self) -> list[Fact]: ...
    def find(self) -> list[Found]: ...
    def forget(self, job_id: str) -> None: ...


@dataclass
class _Proc:
    job_id: str
    attempt: int
    pid: int
    popen: subprocess.Popen | None
    """None for a process found after a restart (not this agent's child: its exit code is unknown)."""
    run_file: Path
    first_iteration_seen: bool = False
    stop_asked_at: float | None = None
    lease_renewed_at: float = 0.0


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def machine_cores(cores: tuple[int, ...] | list[int]) -> set[int]:
    """The machine's CPUs for the agent's core numbers: the n-th core offered is the n-th CPU this process may
    use, wrapping around when the agent offers more cores (`--cpus`) than the machine has, so pinning never
    names a CPU that does not exist."""
    usable = sorted(os.sched_getaffinity(0))
    return {usable[c % len(usable)] for c in cores} if usable else set()


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 12_000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def pid_alive(pid: int, marker: str | None = None) -> bool:
    """A live (not zombie) process, whose command line or environment holds `marker` when given (pids are
    reused)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        if marker is not None:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    return True
            with open(f"/proc/{pid}/environ", "rb") as f:  # a workload's command: RUBICK_RUN_FILE names it
                return marker.encode() in f.read()
        return True
    except (OSError, IndexError):
        return False


@dataclass
class LocalLauncher:
    state_dir: Path
    node: str
    nats_url: str | None
    cpu_devices: bool = True
    trainer: Path = TRAINER
    python: str = sys.executable
    run_extra: dict[str, Any] = field(default_factory=dict)
    """Added to every run file (size, seed, lr, checkpoint_every, ...)."""
    stop_timeout_s: float = 300.0
    lease_s: float = field(default_factory=lease.lease_seconds)
    """The training lease (`agents.lease`): its processes checkpoint and exit when it is not renewed for
    this long (0: never). Renewed at every poll."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to the training processes' environment: the node's reporter credentials (docs/security.md)."""
    traffic_classes: TrafficClasses | None = DEFAULT_TRAFFIC_CLASSES
    """What a job's traffic class sets in its processes' environment (`agents.traffic`; None: nothing)."""
    warm: bool = True
    """Start the trainer's processes warm (`agents.torchrun`): forked from torchrun once it imported torch, DeepSpeed
    and the trainer's modules, instead of each importing them afresh. Only with CPU devices (`warm_start`)."""
    procs: dict[str, _Proc] = field(default_factory=dict)

    @property
    def warm_start(self) -> bool:
        """Whether the project's trainer starts warm: asked for (`warm`) and on CPU devices, since a process that
        probed CUDA (DeepSpeed's import does) cannot hand it across a fork."""
        return self.warm and self.cpu_devices and bool(warm_modules(self.trainer))

    def job_dir(self, job_id: str) -> Path:
        return Path(self.state_dir) / "jobs" / job_id

    # --- launching -------------------------------------------------------------------------------
    def launch(self, a: Launch) -> None:
        if a.job.job_id in self.procs:
            raise LaunchError(f"job {a.job.job_id} still has processes here")
        d = self.job_dir(a.job.job_id)
        (d / "control").mkdir(parents=True, exist_ok=True)
        for stale in (d / "control" / "stop", d / "status.json"):
            stale.unlink(missing_ok=True)
        for pid_file in (d / "pids").glob("rank-*") if (d / "pids").is_dir() else ():
            pid_file.unlink(missing_ok=True)
        try:
            targs = torchrun_args(a.job.job_id, a.allocation, self.node)
        except PlanError as exc:
            raise LaunchError(str(exc)) from None
        workload = a.job.workload
        if workload is not None and not workload.command:
            raise LaunchError("the local launcher runs a workload's command, and this workload has none "
                              "(an image's entrypoint needs the Kubernetes launcher)")
        ckpt = workload.checkpoint.host_path if workload and workload.checkpoint else None
        if workload and workload.checkpoint and ckpt is None:
            raise LaunchError(f"the local launcher cannot mount PVC {workload.checkpoint.pvc}: give the checkpoint "
                              "a host_path")
        if ckpt:
            try:
                Path(ckpt).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LaunchError(f"checkpoint folder {ckpt}: {exc.strerror or exc}") from None
        files = contract.local_files(d, a.attempt, ckpt)
        run = contract.run_record(a.job.job_id, a.job.model_type, a.plan, a.allocation, a.share, self.node, a.attempt,
                                  a.job.global_batch_size, a.job.target_iterations, self.nats_url, str(d),
                                  **self.run_extra)
        run_file = Path(files.run_file)
        try:
            write_json(Path(files.deepspeed_config), contract.deepspeed_file_content(run))
        except PlanError as exc:
            raise LaunchError(str(exc)) from None
        write_json(run_file, run)
        Path(files.ready_file).unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "OMP_NUM_THREADS": str(max(1, (a.share.cpus or 1) // max(1, a.share.gpus))),
               **traffic_env(self.traffic_classes, a.traffic_class), **(workload.env if workload else {}), **torchrun_env(a.allocation),
               **contract.contract_env(run, files, self.lease_s), **self.env}
        if not self.cpu_devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in a.devices)
        if workload is not None:
            cmd = [self.python, "-m", "agents.torchrun", *targs, "--no-python", *workload.argv]
            cwd = Path(workload.working_dir) if workload.working_dir else d
        else:
            cwd = REPO
            cmd = trainer_command(self.python, targs, str(self.trainer), [str(run_file)], warm=self.warm_start)
        cores = machine_cores(a.cpu_cores)

        def bind() -> None:  # runs in the child before exec: torchrun and its workers inherit it
            if cores:
                os.sched_setaffinity(0, cores)

        lease.renew(d)
        with open(d / f"log-a{a.attempt}.txt", "ab") as log:
            try:
                popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=bind)
            except OSError as exc:
                raise LaunchError(f"{cmd[0]}: {exc}") from None
        write_json(d / "launch.json", {"job_id": a.job.job_id, "attempt": a.attempt, "pid": popen.pid,
                                       "plan": to_plain(a.plan), "allocation": [to_plain(s) for s in a.allocation],
                                       "devices": list(a.devices), "cpu_cores": list(a.cpu_cores),
                                       "run_file": str(run_file), "cmd": cmd, "launched_at": time.time()})
        self.procs[a.job.job_id] = _Proc(a.job.job_id, a.attempt, popen.pid, popen, run_file)

    def request_stop(self, job_id: str, attempt: int) -> None:
        """Ask for checkpoint-and-exit: the trainer looks for the stop file between iterations."""
        proc = self.procs.get(job_id)
        if proc is None or proc.attempt != attempt:
            return
        stop = self.job_dir(job_id) / "control" / "stop"
        stop.parent.mkdir(parents=True, exist_ok=True)
        stop.write_text(str(time.time()))
        proc.stop_asked_at = time.monotonic()

    def kill(self, job_id: str) -> None:
        """SIGKILL whatever is left of the job's process group."""
        proc = self.procs.pop(job_id, None)
        pid = proc.pid if proc else (read_json(self.job_dir(job_id) / "launch.json") or {}).get("pid")
        if isinstance(pid, int):
            _killpg(pid)
            if proc and proc.popen is not None:
                try:
                    proc.popen.wait(5)
                except subprocess.TimeoutExpired:
                    pass

    # --- watching --------------------------------------------------------------------------------
    def poll(self) -> list[Fact]:
        facts: list[Fact] = []
        now = time.time()
        for job_id in sorted(self.procs):
            proc = self.procs[job_id]
            if self.lease_s > 0 and now - proc.lease_renewed_at >= min(1.0, self.lease_s / 4):
                lease.renew(self.job_dir(job_id), now)
                proc.lease_renewed_at = now
            status = self._status(proc)
            if not proc.first_iteration_seen and status and status.get("first_iteration_at"):
                proc.first_iteration_seen = True
                facts.append(FirstIteration(job_id, proc.attempt, float(status["first_iteration_at"])))
            code: int | None
            if proc.popen is not None:
                code = proc.popen.poll()
                done = code is not None
            else:
                code, done = None, not pid_alive(proc.pid, str(proc.run_file))
            if not done and proc.stop_asked_at and time.monotonic() - proc.stop_asked_at > self.stop_timeout_s:
                _killpg(proc.pid)  # did not checkpoint in time; its exit shows up at the next poll
                continue
            if not done:
                continue
            _killpg(proc.pid)  # a worker may outlive torchrun; nothing of the job stays behind
            del self.procs[job_id]
            status = self._status(proc) or {}
            said = status.get("error") if status.get("state") == "failed" else None
            facts.append(Exited(job_id, proc.attempt, now, code, status.get("state"),
                                int(status.get("iteration") or 0),
                                log_tail(self.job_dir(job_id) / f"log-a{proc.attempt}.txt"),
                                reason=f"the training code failed: {said}" if said else ""))
        return facts

    def _status(self, proc: _Proc) -> dict[str, Any] | None:
        status = read_json(self.job_dir(proc.job_id) / "status.json")
        return status if status and status.get("attempt") == proc.attempt else None

    def find(self) -> list[Found]:
        """Jobs in the state folder from an earlier agent; the live ones are watched from now on."""
        found: list[Found] = []
        jobs = Path(self.state_dir) / "jobs"
        for launch_file in sorted(jobs.glob("*/launch.json")) if jobs.is_dir() else ():
            rec = read_json(launch_file)
            try:
                job_id, attempt, pid = rec["job_id"], int(rec["attempt"]), int(rec["pid"])
                plan = build(Plan, rec["plan"])
                allocation = tuple(build(NodeShare, s) for s in rec["allocation"])
            except Exception:  # an unreadable record: nothing can be said about it
                continue
            run_file = Path(rec.get("run_file", ""))
            alive = pid_alive(pid, str(run_file))
            status = read_json(launch_file.parent / "status.json") or {}
            if status.get("attempt") != attempt:
                status = {}
            found.append(Found(job_id, attempt, plan, allocation, tuple(rec.get("devices", ())),
                               tuple(rec.get("cpu_cores", ())), alive, status.get("state"),
                               int(status.get("iteration") or 0),
                               log_tail(launch_file.parent / f"log-a{attempt}.txt")))
            if alive and job_id not in self.procs:
                self.procs[job_id] = _Proc(job_id, attempt, pid, None, run_file,
                                           first_iteration_seen=bool(status.get("first_iteration_at")))
        return found

    def forget(self, job_id: str) -> None:
        """Stop watching a job whose end is reported (the record stays for its checkpoint and log)."""
        launch_file = self.job_dir(job_id) / "launch.json"
        rec = read_json(launch_file)
        if rec is not None:
            launch_file.rename(launch_file.with_name(f"launch-a{rec.get('attempt', 0)}.done.json"))


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
