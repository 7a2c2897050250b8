"""The Kubernetes launcher's own cost, against kmock's Kubernetes emulator on 127.0.0.1 (no real API server
here: the API's own latency, the scheduler, the kubelet and image pulls are not in these figures).

Per run (fresh emulator, agent core and launcher; node n0 with 8 GPUs):
  1. launch: from the core handling `plan.decided` to the pod object created in the API (node check,
     create), and to the launcher's watch holding it;
  2. multi-node launch (2 nodes): the same with the rendezvous Service;
  3. reconfiguration (2 -> 4 GPUs): from the new `plan.decided` to the stop annotation on the pod (ask),
     then, the test playing kubelet, from the pod's exit with `{"state": "checkpointed"}` to the
     launcher reporting it (exit), to the old pod deleted and the new attempt's pod created (delete,
     create), and the whole cycle (ask + exit report + delete + create, the trainer's own checkpoint
     time left out).
Prints each figure's median over the runs, with min and max, in milliseconds.

    python bench/k8s_launcher.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agents.contract import STOP_ANNOTATION  # noqa: E402
from agents.core import Exited  # noqa: E402
from agents.kube import manifests as m  # noqa: E402
from tests.agents.kube.emulator import ApiServer, node_object  # noqa: E402
from tests.agents.kube.helpers import (Driver, Kubelet, decided, decision, launcher, registered,  # noqa: E402
                                       submitted)


def _wait(what, timeout=10.0, step=0.0005):
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        got = what()
        if got:
            return got
        time.sleep(step)
    raise TimeoutError(str(what))


def one_run() -> dict[str, float]:
    import kubernetes

    server = ApiServer()
    out: dict[str, float] = {}
    made = []
    try:
        v1 = kubernetes.client.CoreV1Api(server.api())
        for node in ("n0", "n1"):
            v1.create_node(node_object(node), _preload_content=False)
        kubelet = Kubelet(server)
        lau = launcher(server)
        made.append(lau)
        d = Driver(lau)
        d.handle(registered("n0"), registered("n1"), submitted("j1"), submitted("j2"))
        lau.start()
        _wait(lambda: lau.pod_watch.synced.is_set())
        name = m.pod_name("j1", 1, 0)
        t0 = time.perf_counter()
        d.handle(decided(decision("j1")))
        out["launch: decided -> pod created"] = time.perf_counter() - t0
        _wait(lambda: lau.pod_watch.get(name))
        out["launch: decided -> pod in watch"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        d.handle(decided(decision("j2", shares=(("n0", 2), ("n1", 2))), t=3.0))
        out["multi-node launch: decided -> service+pod created"] = time.perf_counter() - t0

        kubelet.ready(name)
        d.until(lambda: lau.pods["j1"].first_iteration_seen)
        t_ask = time.perf_counter()
        d.handle(decided(decision("j1", shares=(("n0", 4),)), t=10.0))
        _wait(lambda: STOP_ANNOTATION in (kubelet.pods()[name]["metadata"].get("annotations") or {}))
        out["reconfigure: decided -> stop annotation"] = time.perf_counter() - t_ask
        t_exit = time.perf_counter()
        kubelet.exit(name, 0, json.dumps({"state": "checkpointed", "iteration": 10}))
        second = m.pod_name("j1", 2, 0)
        reported = None
        deadline = time.perf_counter() + 10
        while not ("j1" in lau.pods and lau.pods["j1"].attempt == 2):
            if time.perf_counter() > deadline:
                raise TimeoutError("attempt 2 not launched")
            t_poll = time.perf_counter()
            facts = d.watch()  # the Exited fact is carried out in the same call: delete, create
            if reported is None and any(isinstance(f, Exited) for f in facts):
                reported = t_poll
            time.sleep(0.0005)
        t_created = time.perf_counter()
        out["reconfigure: pod exit -> exit reported"] = (reported or t_created) - t_exit
        out["reconfigure: pod exit -> old deleted, new created"] = t_created - t_exit
        assert name not in kubelet.pods() and second in kubelet.pods()
        out["reconfigure: whole cycle (ask + exit + delete + create)"] = (
            out["reconfigure: decided -> stop annotation"] + out["reconfigure: pod exit -> old deleted, new created"])
    finally:
        for lau in made:
            lau.close()
        server.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    runs = [one_run() for _ in range(max(5, args.runs))]
    print(f"Kubernetes launcher against kmock's emulator, {len(runs)} runs (ms: median [min, max])")
    for key in runs[0]:
        values = [r[key] * 1000 for r in runs]
        print(f"  {key:<58} {statistics.median(values):8.1f}  [{min(values):.1f}, {max(values):.1f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
