"""Launches of the example trainer forked from one warm process, for a caller that launches it many times in a row
on CPU devices (the accuracy tests):

    with Forks() as forks:
        status = run(job_dir, {"plan": {"dp": 2}, "global_batch_size": 8, "target_iterations": 40}, nproc=2,
                     forks=forks)

`Forks` starts one process (`python -m examples.trainer.forks`) that imports what the trainer's warm start imports
(`agents.plan_config.warm_modules`: torch, DeepSpeed, the trainer, `torch._dynamo`) and then, for each launch asked
of it, forks a child that runs `agents.torchrun` on the launch's arguments, in a session of its own, with its output
in the launch's log. Such a launch skips torchrun's own imports (about 7 s of CPU on a small machine), which
`runner.start` pays at every launch. What runs is otherwise the same: torchrun with its rendezvous on 127.0.0.1,
workers forked from it with the modules loaded (the warm start), the trainer. One launch at a time: the process
answers a launch with its child's pid, and with the child's exit code once it ended.

Not for the agent: a node's launches come and go in any order, and a job must outlive the agent that started it.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agents.plan_config import TRAINER_DIR, warm_modules
from controlplane.lifetime import die_with_parent, exit_at_once

LAUNCHER = ("-m", "agents.torchrun")
"""How a launch's command (`agents.plan_config.trainer_command`) names torchrun, after the interpreter."""


class Forked:
    """A launch forked by `Forks`, as much of `subprocess.Popen` as the runner uses: `pid` (its process group's
    too), `returncode`, `poll`, `wait`."""

    def __init__(self, forks: Forks, pid: int, args: Sequence[str]) -> None:
        self.forks, self.pid, self.args = forks, pid, list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.forks._ready(0.0):
            self.returncode = int(self.forks._answer()["exit"])
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self.forks._ready(timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(self.forks._answer()["exit"])
        return self.returncode


class Forks:
    """The warm process and its pipe (see the module's docstring). `env`: the launches' environment, fixed for all of
    them (it is the warm process's own)."""

    def __init__(self, env: dict[str, str] | None = None, start_timeout: float = 300.0) -> None:
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 - the warm process's stderr, read on a failure
        self.proc = subprocess.Popen([sys.executable, "-m", "examples.trainer.forks"], cwd=REPO,
                                     env=env if env is not None else dict(os.environ), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._errors, bufsize=0,
                                     preexec_fn=die_with_parent(signal.SIGTERM))
        # unbuffered: an answer read is read from the pipe alone, so `select` on the pipe sees every one not read yet
        self._last: Forked | None = None
        try:
            if not self._ready(start_timeout) or self._answer().get("ready") is not True:
                raise RuntimeError(f"the warm process did not start: {self._said()}")
        except BaseException:
            self.close()
            raise

    def start(self, cmd: Sequence[str], cwd: Path, log: Path) -> Forked:
        """Fork a launch of `cmd` (an `agents.torchrun` command, as `trainer_command` makes it with `warm`), its
        output appended to `log`."""
        if tuple(cmd[1:3]) != LAUNCHER or len(cmd) < 4 or not cmd[3].startswith("--preload="):
            raise ValueError(f"not a warm launch of agents.torchrun: {' '.join(cmd)}")
        if self._last is not None and self._last.returncode is None:
            raise RuntimeError("the warm process forks one launch at a time, and the last one is still running")
        self._send({"argv": list(cmd[3:]), "cwd": str(cwd), "log": str(log)})
        if not self._ready(60.0):
            raise RuntimeError(f"the warm process did not fork the launch: {self._said()}")
        self._last = Forked(self, int(self._answer()["pid"]), cmd)
        return self._last

    def close(self) -> None:
        """End the warm process (a launch still running ends with it, after at most 10 s)."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._errors.close()

    def __enter__(self) -> Forks:  # noqa: PYI034 - a class of its own, never subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the pipe ----------------------------------------------------------------------------------------------
    def _send(self, doc: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(doc).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise RuntimeError(f"the warm process is gone ({exc}): {self._said()}") from None

    def _ready(self, timeout: float | None) -> bool:
        assert self.proc.stdout is not None
        return bool(select.select([self.proc.stdout], [], [], timeout)[0])

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm process ended (exit code {self.proc.wait()}): {self._said()}")
        return json.loads(line)

    def _said(self, limit: int = 4000) -> str:
        self._errors.seek(0)
        return self._errors.read().decode(errors="replace")[-limit:]


# --- the warm process ----------------------------------------------------------------------------------------------
def serve() -> None:
    """Import the warm modules, then fork each launch read from stdin and answer on stdout (one JSON line each:
    `{"ready": true}` once, then `{"pid": ...}` and `{"exit": ...}` for every launch)."""
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # what the imports print goes to stderr, never into the answers
    for name in warm_modules(TRAINER_DIR / "train.py"):
        importlib.import_module(name)
    from agents import torchrun

    dies = die_with_parent(signal.SIGTERM)  # made here: it names this process as the launches' parent
    answers.write(b'{"ready": true}\n')
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        ask = json.loads(line)
        pid = os.fork()
        if pid == 0:
            answers.close()  # the launch and its workers hold no end of the pipe
            _launch(ask, torchrun, dies)
        answers.write(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    exit_at_once(0)  # the caller closed the pipe: nothing to tear down (torch's teardown costs seconds of CPU)


def _launch(ask: dict[str, Any], torchrun: Any, dies: Any) -> None:
    """The child of a launch: its own session, its log as stdout and stderr, torchrun on its arguments; never
    returns."""
    code = 1
    try:
        os.setsid()
        if dies is not None:
            dies()
        os.chdir(ask["cwd"])
        log = os.open(ask["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.argv = ["agents.torchrun", *ask["argv"]]
        torchrun.main(list(ask["argv"]))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - torchrun's report of a failed worker, as a launch of its own prints it
        traceback.print_exc()
    try:
        exit_at_once(code)
    finally:  # whatever happens, the child never returns into the warm process's loop
        os._exit(code)


if __name__ == "__main__":
    serve()
