"""`rubick profile --spec SPEC`: measure a model type on this machine for the performance model.

Runs sampled configurations (at least seven, three of them under ZeRO-Offload, and the tensor- and
pipeline-parallel ones the architecture allows on the devices) of a GPT-style model with the spec's
architecture, one torchrun launch per world size, and publishes
every timed iteration as `metrics.iteration` (job id `profile-<model>`). It writes the medians
as a table in the columns of `fit_points.csv`, and the spec with its measured one-device forward
time, so that `rubick model fit --spec OUT.yaml --points OUT.csv` fits the model type.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from controlplane.cli.common import add_nats_args, fail
from controlplane.events import Plan
from controlplane.events.schema import to_plain
from controlplane.bus.nats import redact_url

MIN_CONFIGS, MIN_OFFLOAD = 7, 3
CSV_COLUMNS = ("model", "plan_label", "dp", "tp", "pp", "zero_stage", "offload", "gc", "ga_steps", "gpus_per_node",
               "total_gpus", "cpu_threads", "global_batch_size", "iter_time_s", "forward_ms", "overlap_sync_ms",
               "optimize_ms", "source")


def register_profile(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure a model type's configurations here, for `rubick model fit`")
    p.add_argument("--spec", required=True, help="model spec YAML (name, num_layers, hidden_size, num_heads, ...)")
    add_nats_args(p)
    p.add_argument("--no-publish", action="store_true", help="do not publish metrics.iteration")
    p.add_argument("--devices", type=int, default=0,
                   help="devices to use (default: the GPUs; with --cpu-devices, that many CPU workers)")
    p.add_argument("--cpu-devices", type=int, default=0, metavar="N", help="no GPUs: N CPU worker slots")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per configuration")
    p.add_argument("--iterations", type=int, default=5, help="timed iterations per configuration")
    p.add_argument("--out", type=Path, default=None, help="measured table (default: profile-<model>.csv)")
    p.add_argument("--out-spec", type=Path, default=None,
                   help="spec with the measured fwd_time_s (default: profile-<model>.yaml)")
    p.set_defaults(func=run_profile)


def sample_plans(devices: int, global_batch_size: int, heads: int | None = None,
                 layers: int | None = None) -> list[Plan]:
    """The configurations to measure: both DP sizes, every ZeRO stage, GA and GC, and ZeRO-Offload; with the
    model's `heads` and `layers`, also TP 2 and TP over every device, PP 2 and PP over every device, and
    TP 2 x PP 2, where they divide the heads and layers (PP with one sample per micro-batch, as the policy
    enumerates 3D plans)."""
    n = devices
    plans = [Plan(dp=1), Plan(dp=1, ga_steps=2), Plan(dp=1, gc=True), Plan(dp=n), Plan(dp=n, zero_stage=1),
             Plan(dp=n, zero_stage=2), Plan(dp=n, zero_stage=3),
             Plan(dp=1, zero_stage=2, offload=True), Plan(dp=n, zero_stage=2, offload=True),
             Plan(dp=n, zero_stage=3, offload=True, ga_steps=2)]
    if n == 1:
        plans += [Plan(zero_stage=1), Plan(zero_stage=2), Plan(zero_stage=3), Plan(zero_stage=1, offload=True)]
    if heads and layers and n > 1:
        for tp, pp in ((2, 1), (n, 1), (1, 2), (1, n), (2, 2)):
            if tp * pp > n or n % (tp * pp) or heads % tp or layers % pp:
                continue
            dp = n // (tp * pp)
            if global_batch_size % dp:
                continue
            plans.append(Plan(dp=dp, tp=tp, pp=pp, micro_batches=global_batch_size // dp if pp > 1 else 1))
    out: list[Plan] = []
    for plan in plans:
        if global_batch_size % (plan.dp * plan.ga_steps) == 0 and plan not in out:
            out.append(plan)
    return out


def csv_row(model: str, plan: Plan, result: dict[str, float], global_batch_size: int,
            cpu_threads: int | None) -> dict[str, Any]:
    def ms(x: float | None) -> str:
        return "" if x is None else f"{x * 1000:.4f}"
    return {"model": model, "plan_label": plan.code(), "dp": plan.dp, "tp": plan.tp, "pp": plan.pp,
            "zero_stage": plan.zero_stage, "offload": int(plan.offload), "gc": int(plan.gc), "ga_steps": plan.ga_steps,
            "gpus_per_node": plan.gpus, "total_gpus": plan.gpus, "cpu_threads": cpu_threads or "",
            "global_batch_size": global_batch_size, "iter_time_s": f"{result['iter_time_s']:.6f}",
            "forward_ms": ms(result.get("fwd_s")), "overlap_sync_ms": ms(result.get("bwd_s")),
            "optimize_ms": ms(result.get("opt_s")), "source": "profile"}


def run_profile(args: argparse.Namespace) -> int:
    from modeler.spec import SpecError, load_model

    try:
        model = load_model(args.spec)
    except SpecError as exc:
        return fail(str(exc))
    devices = args.devices or args.cpu_devices
    if not devices:
        from .node import nvidia_gpus
        devices = nvidia_gpus()[0]
    if devices < 1:
        return fail("no devices: give --cpu-devices N to profile on the CPU")
    spec = model.spec
    gbs = spec.global_batch_size
    plans = sample_plans(devices, gbs, spec.num_heads, spec.num_layers)
    n_off = sum(p.offload for p in plans)
    if len(plans) < MIN_CONFIGS or n_off < MIN_OFFLOAD:
        return fail(f"global batch {gbs} leaves {len(plans)} configurations ({n_off} offload); "
                    f"need {MIN_CONFIGS} ({MIN_OFFLOAD} offload): use a batch divisible by {2 * devices}")
    url = None
    if not args.no_publish:
        from controlplane.auth import Identity
        from controlplane.auth.credentials import ENV_CREDS, ENV_TLS_CA
        from controlplane.cli.common import credentials_for
        from controlplane.endpoints import resolve_nats_url
        url = resolve_nats_url(args.nats_url, args.data_dir)
        # the measuring processes report as the operator who profiles: the bootstrap identity of a local
        # `rubick up`, or the credentials given (docs/security.md)
        credentials = credentials_for(args, Identity("admin"))
        if credentials.seed_file is not None:
            os.environ.setdefault(ENV_CREDS, str(Path(credentials.seed_file).resolve()))
        if credentials.tls_ca is not None:
            os.environ.setdefault(ENV_TLS_CA, str(Path(credentials.tls_ca).resolve()))
    out = args.out or Path(f"profile-{spec.name}.csv")
    out_spec = args.out_spec or Path(f"profile-{spec.name}.yaml")
    arch = {"hidden": spec.hidden_size, "layers": spec.num_layers, "heads": spec.num_heads, "seq_len": spec.seq_len,
            "vocab_size": model.vocab_size}
    results = _measure_all(plans, arch, spec.name, gbs, devices, url, args)
    if results is None:
        return 1
    cpu_threads = 1 if args.cpu_devices else None
    rows = [csv_row(spec.name, plan, results[plan.code()], gbs, cpu_threads) for plan in plans]
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    base = results[Plan(dp=1).code()]
    doc = {k: v for k, v in to_plain(spec).items() if v is not None}
    doc.update(fwd_time_s=round(float(base["fwd_s"]), 6), vocab_size=model.vocab_size)
    out_spec.write_text(f"# {spec.name}, forward time measured by rubick profile on this machine\n"
                        + yaml.safe_dump(doc, sort_keys=False))
    print(f"{'plan':28s} {'iter s':>9s} {'fwd s':>9s} {'bwd s':>9s} {'opt s':>9s}")
    for plan in plans:
        r = results[plan.code()]
        cells = " ".join("        -" if r.get(k) is None else f"{r[k]:9.4f}" for k in ("fwd_s", "bwd_s", "opt_s"))
        print(f"{plan.code():28s} {r['iter_time_s']:9.4f} {cells}")
    unsent = sum(int(r.get("unsent", 0)) for r in results.values())
    if url and unsent:
        print(f"rubick profile: {unsent} measurements could not be published to {redact_url(url)} (is the control plane up?)",
              file=sys.stderr)
    print(f"{len(plans)} configurations ({n_off} under ZeRO-Offload){' published to ' + url if url else ''}; "
          f"wrote {out} and {out_spec}")
    print(f"fit with: rubick model fit --spec {out_spec} --points {out} --out params-{spec.name}.json")
    return 0


def _measure_all(plans: list[Plan], arch: dict, name: str, gbs: int, devices: int, url: str | None,
                 args: argparse.Namespace) -> dict[str, dict[str, float]] | None:
    from .launcher import REPO
    if str(REPO) not in sys.path:  # the example trainer lives in the checkout, beside the packages
        sys.path.insert(0, str(REPO))
    from examples.trainer.runner import start, tail

    script = REPO / "examples" / "trainer" / "profile_run.py"
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="rubick-profile-") as tmp:
        for launch, world in enumerate(sorted({p.gpus for p in plans})):
            job_dir = Path(tmp) / f"world{world}"
            group = [to_plain(p) for p in plans if p.gpus == world]
            run = {"job_id": f"profile-{name}", "model_type": name, "plan": group[0], "plans": group, "arch": arch,
                   "global_batch_size": gbs, "warmup": args.warmup, "iterations": args.iterations,
                   "gpus_per_node": [world], "nats_url": url, "launch": launch,
                   "cpus_per_gpu": 1 if args.cpu_devices else None}
            proc = start(job_dir, run, nproc=world, script=script)
            if proc.wait() != 0 or not (job_dir / "profile.json").exists():
                print(f"rubick profile: the launch on {world} devices failed:\n{tail(job_dir)}", file=sys.stderr)
                return None
            for r in json.loads((job_dir / "profile.json").read_text()):
                results[r.pop("plan")] = r
    return results
