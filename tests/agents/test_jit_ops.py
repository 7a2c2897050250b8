"""A training process killed while DeepSpeed builds or loads an op (holding torch's build baton) must not
stall every later training process on the machine: the build guard of `agents.jit_ops`.

The builds here are real torch `cpp_extension` builds (a one-function C++ library, compiled by ninja), the
killed loader a real process ended by SIGKILL, and the last test a real training run of the example
trainer through DeepSpeed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agents import jit_ops
from agents.contract import TrainingJob
from examples.trainer.runner import run

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)

SOURCE = "extern \"C\" int rubick_answer() { return 42; }\n"

LOADER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from torch.utils.cpp_extension import load
    from agents import jit_ops
    name, src, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    build = lambda: load(name, [src], is_python_module=False, verbose=False)
    if mode == "plain":
        build()
    elif mode == "guarded":
        jit_ops.guarded(name, build)
    elif mode == "die-holding-the-baton":
        def hold():
            (jit_ops.build_folder(name) / jit_ops.BATON).touch()  # what torch's loader makes first
            print("holding", flush=True)
            time.sleep(600)
        jit_ops.guarded(name, hold)
    print("loaded", flush=True)
""")


def loader(tmp: Path, name: str, mode: str, own_folder: bool = True) -> subprocess.Popen:
    """A process loading op `name` in `mode`; its builds in `tmp/ext`, or with `own_folder` False where torch
    builds DeepSpeed's ops for every process of this machine."""
    src = tmp / "answer.cpp"
    src.write_text(SOURCE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if own_folder:
        env["TORCH_EXTENSIONS_DIR"] = str(tmp / "ext")
    return subprocess.Popen([sys.executable, "-c", LOADER, name, str(src), mode], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(proc: subprocess.Popen, timeout: float) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


def _killed_holding_the_baton(tmp: Path) -> Path:
    """A loader killed (SIGKILL) while it holds the guard and torch's baton: the baton it leaves."""
    holder = loader(tmp, "answer", "die-holding-the-baton")
    assert holder.stdout.readline().strip() == "holding"
    baton = tmp / "ext" / "answer" / jit_ops.BATON
    assert baton.exists()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert baton.exists(), "the killed holder left its baton"
    return baton


def test_a_baton_left_by_a_killed_loader_stalls_plain_loads_and_not_guarded_ones(tmp_path):
    # torch's own loader waits for the stale baton for ever. No guarded loader runs meanwhile: one would take the
    # stale baton away and build, and the plain loader would then load what it built
    baton = _killed_holding_the_baton(tmp_path)
    plain = loader(tmp_path, "answer", "plain")
    with pytest.raises(subprocess.TimeoutExpired):
        plain.communicate(timeout=3.0)
    plain.kill()
    plain.communicate()
    assert baton.exists()

    # a guarded loader waits on the guard while a holder lives, and once it is killed takes its baton away
    holder = loader(tmp_path, "answer", "die-holding-the-baton")
    assert holder.stdout.readline().strip() == "holding"
    waiting = loader(tmp_path, "answer", "guarded")
    time.sleep(1.0)
    assert waiting.poll() is None
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert "loaded" in finished(waiting, timeout=120)
    assert (tmp_path / "ext" / "answer" / "answer.so").exists()
    assert not baton.exists()


def test_guarded_loaders_started_together_all_load(tmp_path):
    procs = [loader(tmp_path, "answer", "guarded") for _ in range(3)]
    for proc in procs:
        assert "loaded" in finished(proc, timeout=180)


def test_the_contract_guards_deepspeed_and_guarding_twice_changes_nothing(tmp_path):
    pytest.importorskip("deepspeed")
    from deepspeed.ops.op_builder.builder import OpBuilder

    run_file = tmp_path / "run.json"
    run_file.write_text('{"job_dir": "%s", "plan": {"dp": 1}, "global_batch_size": 2, "target_iterations": 1}'
                        % tmp_path)
    TrainingJob.from_env({}, run_file=run_file, catch_sigterm=False)
    assert getattr(OpBuilder.jit_load, "_rubick_guarded", False)
    before = OpBuilder.jit_load
    assert jit_ops.guard_builds() == 0
    assert OpBuilder.jit_load is before


@pytest.mark.slow
def test_training_starts_after_a_rank_was_killed_inside_deepspeeds_op_load(tmp_path):
    """The failure this guards against, end to end: a loader killed holding the baton of the op DeepSpeed
    loads in `init_distributed` on a CPU node, then the example trainer runs to the end."""
    killed = loader(tmp_path, "deepspeed_shm_comm", "die-holding-the-baton", own_folder=False)
    try:
        assert killed.stdout.readline().strip() == "holding"
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    st = run(tmp_path / "job", {"global_batch_size": 2, "target_iterations": 2, "plan": {"dp": 1}}, nproc=1,
             timeout=400)
    assert st["state"] == "completed" and st["iteration"] == 2
