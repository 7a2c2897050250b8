"""The Kubernetes launcher: a job's share of a node runs as a pod pinned to that node (docs/workloads.md).

- `manifests`: pure builders, from a `Launch` to the pod and the rendezvous Service of a multi-node job;
- `contract_files`: the init container that writes the training contract's files into the pod;
- `watch`: list-then-watch threads that keep the node's pods and the Node itself in memory;
- `launcher`: `KubernetesLauncher`, the `agents.launcher.Launcher` of pods;
- `capacity`: what a node offers, from its `status.allocatable`.
"""
