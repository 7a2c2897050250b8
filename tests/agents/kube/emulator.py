"""A Kubernetes API for the launcher tests: kmock's `KubernetesEmulator` (an in-memory API server over HTTP)
served on 127.0.0.1 from a thread of its own, so that the official synchronous `kubernetes` client reaches
it as it would a cluster. No real API server runs on these machines.

What the emulator does not do, the tests do by hand through the same API: set a pod's status (phase,
conditions, container states) as a kubelet would, mark a node NotReady. `fail(...)` makes requests that
match a method and path answer with an API error (RBAC's 403, 422, 404) without touching the stored
objects; `logs[pod]` is what `pods/<pod>/log` answers.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import threading
import uuid
from typing import Any

import aiohttp.web
import kubernetes
from kmock import KubernetesEmulator, KubernetesError, Server

PODS, SERVICES, NODES = "v1/pods", "v1/services", "v1/nodes"


class _Emulator(KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.faults: list[tuple[str, re.Pattern, KubernetesError]] = []
        self.logs: dict[str, str] = {}

    async def _handle(self, request):  # noqa: ANN001 - kmock's own request type
        method = str(request.method.value if hasattr(request.method, "value") else request.method).upper()
        path = request.url.path if hasattr(request, "url") and request.url is not None else ""
        for m, pattern, error in list(self.faults):
            if m == method and pattern.search(path):
                return await self._render_error(error)
        if method == "GET" and request.resource is not None and request.subresource == "log":
            if request.name not in self.logs:
                return await self._render_error(KubernetesError(404, "NotFound", f"pods \"{request.name}\" not found"))
            return aiohttp.web.Response(text=self.logs[request.name])
        if request.action is not None and request.action.name == "CREATE" and isinstance(request.data, dict):
            self._defaults(request)
        return await super()._handle(request)

    @staticmethod
    def _defaults(request) -> None:  # noqa: ANN001
        """What the API server adds to a created object (the emulator's watch filters on the namespace)."""
        meta = request.data.setdefault("metadata", {})
        if request.namespace:
            meta["namespace"] = request.namespace
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        if request.resource is not None and request.resource.plural == "pods":
            request.data.setdefault("status", {"phase": "Pending"})


class ApiServer:
    """The emulator on a free port of 127.0.0.1, in a thread; `api()` gives a client configured for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self.k: _Emulator | None = None
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the Kubernetes emulator did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except asyncio.CancelledError:  # closed with connections still open (`close`)
            pass

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with _Emulator() as k, Server(k) as srv:
            k.resources[PODS] = k.ResourceInfo(kind="Pod", namespaced=True)
            k.resources[SERVICES] = k.ResourceInfo(kind="Service", namespaced=True)
            k.resources[NODES] = k.ResourceInfo(kind="Node", namespaced=False)
            self.k, self.port = k, srv.port
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(1)
        if self._thread.is_alive():  # a watch stream the server waits on: cancel what is left
            def cancel() -> None:
                for task in asyncio.all_tasks(self.loop):
                    task.cancel()
            self.loop.call_soon_threadsafe(cancel)
            self._thread.join(3)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self) -> kubernetes.client.ApiClient:
        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        return kubernetes.client.ApiClient(cfg)

    def call(self, fn, *args: Any) -> Any:  # noqa: ANN001
        """Run `fn(emulator, *args)` on the emulator's loop (its objects are the loop's)."""
        async def run() -> Any:
            return fn(self.k, *args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def fail(self, method: str, path_regex: str, status: int, reason: str, message: str) -> None:
        self.call(lambda k: k.faults.append((method.upper(), re.compile(path_regex),
                                             KubernetesError(status, reason, message, {}))))

    def heal(self) -> None:
        self.call(lambda k: k.faults.clear())

    def set_log(self, pod: str, text: str) -> None:
        self.call(lambda k: k.logs.__setitem__(pod, text))

    def requests(self) -> list[tuple[str, str]]:
        return self.call(lambda k: [(str(r.method.value if hasattr(r.method, "value") else r.method).upper(),
                                     str(r.url.path) if r.url is not None else "") for r in k.requests])


def now_iso(offset_s: float = 0.0) -> str:
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset_s)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def node_object(name: str, ready: str = "True", gpus: int = 8, cpus: str = "96", memory: str = "1000Gi",
                since: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                  "nvidia.com/gpu.memory": "81559"}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": cpus, "memory": memory},
                       "conditions": [{"type": "Ready", "status": ready,
                                       "lastTransitionTime": since or now_iso(-3600)}]}}
