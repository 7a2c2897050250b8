"""torchrun whose rendezvous stores listen on the loopback interface when their endpoint is a loopback address.

    python -m agents.torchrun --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d \
        --rdzv-endpoint=127.0.0.1:0 --rdzv-id=JOB --local-addr=127.0.0.1 train.py RUN_FILE

torchrun's TCP stores listen on every interface whatever their host name (the C++ server binds the
wildcard address), so a single-node job would accept connections from the whole network. Here a store
served for a loopback host is handed a socket bound to 127.0.0.1 instead (`master_listen_fd`); stores for
any other host (the first node of a multi-node job) are left as torchrun makes them. The workers' own
sockets follow `GLOO_SOCKET_IFNAME` / `NCCL_SOCKET_IFNAME`, which the launcher sets to `lo` for a job on
one node (`agents.plan_config.torchrun_env`).

Warm start (`--preload=MODULE[,MODULE...]` as the first argument, with torchrun's own `--start-method=fork
--run-path`): the modules are imported here before the launch, and torchrun forks its workers from this process,
which runs the script in each (`runpy`) with those modules already loaded. A worker then starts in a fraction of a
second instead of importing torch and DeepSpeed afresh (seconds of CPU each, on every start and every restart of a
reconfiguration). Only for a process that has not touched an accelerator: CUDA cannot be used across a fork once
initialised, and DeepSpeed's import probes it, so the launcher asks for this on CPU devices only. A forked worker
that ends waits until torchrun has read its result; torchrun reads none once it is stopping (SIGTERM), so here the
workers are released as the stop begins (`_releasing`), and one that checkpoints and ends on the stop is gone at once
rather than at torchrun's kill 30 s later.

torchrun starts each worker in a session of its own. The agent stops a job that does not checkpoint in time with
SIGKILL to torchrun's process group, which torchrun cannot pass on: here each worker asks the kernel for SIGKILL
when torchrun dies (Linux), so no worker outlives its job. Everything else is torchrun itself.
"""

from __future__ import annotations

import importlib
import ipaddress
import signal
import socket
import sys
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import api as mp_api
from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

from controlplane.lifetime import die_with_parent, exit_at_once

_ARGS = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
         "master_listen_fd", "use_libuv")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LoopbackTCPStore(dist.TCPStore):
    """A TCPStore whose server, for a loopback host, listens on 127.0.0.1 only."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.update(zip(_ARGS, args))
        if kw.get("is_master") and kw.get("master_listen_fd") is None and is_loopback(str(kw.get("host_name"))):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", int(kw.get("port") or 0)))
            sock.listen(socket.SOMAXCONN)
            kw["host_name"], kw["port"] = "127.0.0.1", sock.getsockname()[1]
            kw["master_listen_fd"] = sock.detach()  # the store's server owns it from now on
        super().__init__(**kw)


def _popen_dying_with_torchrun(popen):
    """`subprocess.Popen` for torchrun's workers: each is killed when torchrun dies."""

    def spawn(*args: Any, **kw: Any):
        own, dies = kw.pop("preexec_fn", None), die_with_parent(signal.SIGKILL)

        def preexec() -> None:
            if dies is not None:
                dies()
            if own is not None:
                own()

        return popen(*args, preexec_fn=preexec, **kw)

    return spawn


def _releasing(close):
    """`MultiprocessContext._close` that first lets forked workers end without waiting for torchrun to read their
    results (it will not read them any more)."""

    def stop(self, *args: Any, **kw: Any):
        finished = getattr(self, "_worker_finished_event", None)
        if finished is not None:
            finished.set()
        return close(self, *args, **kw)

    return stop


def preloads(argv: list[str]) -> tuple[list[str], list[str]]:
    """The modules named by a leading `--preload=A,B`, and the rest of the arguments (torchrun's)."""
    if argv and argv[0].startswith("--preload="):
        return [m for m in argv[0].split("=", 1)[1].split(",") if m], argv[1:]
    return [], argv


def main(argv: list[str]) -> None:
    modules, argv = preloads(argv)
    for name in modules:  # forked workers inherit them (warm start)
        importlib.import_module(name)
    dist.TCPStore = LoopbackTCPStore  # type: ignore[misc]
    subprocess_handler.Popen = _popen_dying_with_torchrun(subprocess_handler.Popen)  # type: ignore[attr-defined]
    c10d_rendezvous_backend.TCPStore = LoopbackTCPStore  # type: ignore[attr-defined]
    mp_api.MultiprocessContext._close = _releasing(mp_api.MultiprocessContext._close)  # type: ignore[method-assign]
    from torch.distributed.run import main as torchrun

    torchrun(argv)  # raises when a worker failed: that ends the usual way, with torchrun's report


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_at_once(0)  # the workers ended and the rendezvous is shut down: nothing is left to tear down
