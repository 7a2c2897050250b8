"""DeepSpeed's just-in-time op builds made safe against a training process killed mid-build.

DeepSpeed compiles some of its ops the first time a process needs them (on a CPU node, the shared-memory
collectives that `deepspeed.init_distributed` loads), through torch's `cpp_extension`. Every load, even of
an op already built, takes torch's file baton: a `lock` file in the op's build folder, made by the loader
and removed when it is done; the others wait until it is gone. A process killed while it holds the baton
leaves the file behind, and from then on every training process on the machine waits for it forever.
The agent kills training processes as part of its work (a job that does not checkpoint in time, a
cancellation, a node drained), so sooner or later one is killed inside that window.

`guard_builds()` wraps DeepSpeed's JIT load so that each runs holding a kernel lock (`fcntl.flock` on
`<op build folder>.guard`), which the kernel releases when its holder dies however it dies. Holding it,
a baton found in the build folder can only have been left by a dead process (every guarded loader takes
the guard first), so it is removed before the load. `TrainingJob.from_env` installs the guard when the
training code has imported DeepSpeed; code of its own that loads ops before that calls it first.
A process that loads DeepSpeed's ops without the guard can still have its baton taken for a stale one.
"""

from __future__ import annotations

import fcntl
import functools
import importlib
import os
from pathlib import Path
from typing import Any, Callable

BATON = "lock"
"""The file torch's `cpp_extension` keeps in a build folder while a process builds or loads there."""

_MODULES = ("deepspeed.ops.op_builder.builder", "op_builder.builder")
"""DeepSpeed's op builders: the second name exists only in a source checkout of DeepSpeed, with its own class."""


def build_folder(name: str) -> Path:
    """Where torch's `cpp_extension` builds the op `name` (made if missing)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def guarded(name: str, load: Callable[[], Any]) -> Any:
    """`load()` holding the build guard of op `name`, a baton left by a dead loader removed first."""
    folder = build_folder(name)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{folder}.guard", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (folder / BATON).unlink(missing_ok=True)  # under the guard, only a dead loader can have left it
        return load()
    finally:
        os.close(fd)  # releases the guard


def _guard_class(cls: type) -> bool:
    jit_load = cls.__dict__.get("jit_load")
    if jit_load is None or getattr(jit_load, "_rubick_guarded", False):
        return False

    @functools.wraps(jit_load)
    def guarded_jit_load(self: Any, *args: Any, **kw: Any) -> Any:
        return guarded(self.name, lambda: jit_load(self, *args, **kw))

    guarded_jit_load._rubick_guarded = True  # type: ignore[attr-defined]
    cls.jit_load = guarded_jit_load
    return True


def guard_builds() -> int:
    """Wrap DeepSpeed's JIT op loads with the build guard (idempotent); returns how many builder classes
    were wrapped now. Nothing happens where DeepSpeed is not installed."""
    wrapped = 0
    for module in _MODULES:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        wrapped += _guard_class(mod.OpBuilder)
    return wrapped
