"""A job's own training code: the optional `workload` of `job.submitted` (docs/workloads.md).

A job without one runs the example trainer. With one, every rank runs `command + args` under
torchrun (local launcher) or in a container of `image` (Kubernetes launcher), with the plan
handed over as described in docs/workloads.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .schema import Invalid, spec

IMAGE_PATTERN = (r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?/)?"
                 r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
                 r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,})?")
"""An OCI image reference as the container runtimes parse it: [registry[:port]/]path[:tag][@digest],
path components in lower case."""
_IMAGE = re.compile(IMAGE_PATTERN)
PVC_PATTERN = r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?"
"""A Kubernetes object name (RFC 1123 subdomain)."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIX = "RUBICK_"
"""The launcher's own variables (docs/workloads.md): a workload may not set them."""
MAX_ARGS = 256
MAX_ARG_LEN = 4096
MAX_ENV = 256


@dataclass(frozen=True)
class CheckpointVolume:
    """Where a job's checkpoints live, across attempts and plans (mounted at `RUBICK_CHECKPOINT_DIR`)."""

    pvc: str | None = spec("PersistentVolumeClaim in the jobs' namespace (Kubernetes launcher)",
                           pattern=PVC_PATTERN, max_len=253, default=None, example="gpt2-ckpt")
    host_path: str | None = spec("absolute folder on the node (local launcher)", pattern=r"/[^\x00]*",
                                 max_len=4096, default=None, example=None)

    def check(self, path: str = "") -> None:
        if (self.pvc is None) == (self.host_path is None):
            raise Invalid("a checkpoint volume is a PVC or a host path, exactly one", path or "checkpoint",
                          "pvc or host_path", "both" if self.pvc else "neither")
        if self.host_path is not None and ".." in self.host_path.split("/"):
            raise Invalid("a host path may not climb with ..", _p(path, "host_path"), "an absolute folder",
                          self.host_path[:80])


@dataclass(frozen=True)
class PlanSupport:
    """The plan features a job's training code can run. The policy decides only plans it allows, and an agent
    refuses any other with `plan.rejected`: both ask `refusal` (docs/workloads.md)."""

    max_tp: int = spec("largest tensor-parallel size it runs (1: none)", ge=1, le=65_536, default=1, example=8)
    max_pp: int = spec("largest pipeline-parallel size it runs (1: none)", ge=1, le=65_536, default=1, example=4)
    zero: bool = spec("ZeRO stages 1-3", default=True, example=True)
    offload: bool = spec("ZeRO-Offload", default=True, example=True)
    zero_with_model_parallel: bool = spec("ZeRO or offload together with tp > 1 or pp > 1", default=False,
                                          example=False)
    gc: bool = spec("gradient checkpointing", default=True, example=True)
    heads: int | None = spec("attention heads of the model the code builds, when not the job's spec's: tp must "
                             "divide them", ge=1, le=1_000_000, default=None, example=None)
    layers: int | None = spec("layers of the model the code builds, when not the job's spec's: pp must divide them",
                              ge=1, le=1_000_000, default=None, example=None)

    def refusal(self, plan) -> tuple[str, str, str, str] | None:
        """(reason, field, expected, got) when the code cannot run `plan`; None when it can."""
        if plan.tp > self.max_tp:
            return ("the job's training code cannot run this tensor-parallel size", "plan.tp", f"<= {self.max_tp}",
                    str(plan.tp))
        if plan.pp > self.max_pp:
            return ("the job's training code cannot run this pipeline-parallel size", "plan.pp",
                    f"<= {self.max_pp}", str(plan.pp))
        if self.heads is not None and self.heads % plan.tp:
            return (f"tp does not divide the {self.heads} attention heads of the model the job's code builds",
                    "plan.tp", f"a divisor of {self.heads}", str(plan.tp))
        if self.layers is not None and self.layers % plan.pp:
            return (f"pp does not divide the {self.layers} layers of the model the job's code builds", "plan.pp",
                    f"a divisor of {self.layers}", str(plan.pp))
        if plan.zero_stage and not self.zero:
            return ("the job's training code does not run ZeRO", "plan.zero_stage", "0", str(plan.zero_stage))
        if plan.offload and not self.offload:
            return ("the job's training code does not run ZeRO-Offload", "plan.offload", "false", "true")
        if (plan.zero_stage or plan.offload) and (plan.tp > 1 or plan.pp > 1) and not self.zero_with_model_parallel:
            return ("the job's training code runs ZeRO and ZeRO-Offload only without tensor or pipeline "
                    "parallelism", "plan.zero_stage", "0 with tp > 1 or pp > 1", str(plan.zero_stage))
        if plan.gc and not self.gc:
            return ("the job's training code does not run gradient checkpointing", "plan.gc", "false", "true")
        return None


DATA_PARALLEL_ONLY = PlanSupport()
"""What a workload that declares nothing is taken to run: the DP family (ZeRO, offload, GA, GC)."""
EXAMPLE_TRAINER = PlanSupport(max_tp=4, max_pp=2, heads=4, layers=2)
"""The example trainer (`examples/trainer`): ZeRO and offload only without TP and PP, and the TP and PP sizes
every model size it builds runs (`tiny` and `small` have 4 heads, `medium` 8; `tiny` has 2 layers, `small`
4, `medium` 6): TP 1, 2 or 4, PP 1 or 2, whatever the model type's spec says."""


@dataclass(frozen=True)
class Workload:
    """The job's own training code; nil in `job.submitted`: the example trainer."""

    image: str | None = spec("container image (the Kubernetes launcher needs one; the local launcher ignores it)",
                             max_len=512, default=None,
                             example="ghcr.io/team-a/gpt2-train:1.4")
    command: tuple[str, ...] = spec("the program every rank runs, with its first arguments (as torchrun "
                                    "--no-python starts it); empty: the image's entrypoint",
                                    default=(), example=("python", "train.py"))
    args: tuple[str, ...] = spec("further arguments after the command", default=(), example=("--lr", "3e-4"))
    working_dir: str | None = spec("absolute folder the command starts in; nil: the job's folder (local) "
                                   "or the image's (Kubernetes)", pattern=r"/[^\x00]*", max_len=4096, default=None,
                                   example="/workspace")
    env: dict[str, str] = spec("environment variables of the training processes (names starting RUBICK_ "
                               "are the launcher's)", default_factory=dict, example={"HF_HOME": "/cache"})
    checkpoint: CheckpointVolume | None = spec("where checkpoints live; nil: the launcher's job folder "
                                               "(local) or an emptyDir that dies with the pod (Kubernetes)",
                                               default=None)
    supports: PlanSupport | None = spec("the plan features the code runs; nil: data parallelism only (ZeRO, "
                                        "offload, GA, GC; no tp or pp)", default=None)

    def check(self, path: str = "") -> None:
        if self.image is not None and not _IMAGE.fullmatch(self.image):
            raise Invalid("not an image reference a container runtime accepts", _p(path, "image"),
                          "[registry[:port]/]name[:tag][@digest], the name in lower case", self.image[:120])
        argv = self.command + self.args
        if len(argv) > MAX_ARGS:
            raise Invalid("too many command words", _p(path, "args"), f"at most {MAX_ARGS}", str(len(argv)))
        for name, words in (("command", self.command), ("args", self.args)):
            for i, word in enumerate(words):
                if not isinstance(word, str):
                    raise Invalid("wrong type", f"{_p(path, name)}[{i}]", "string", type(word).__name__)
                if len(word) > MAX_ARG_LEN or "\x00" in word:
                    raise Invalid("argument too long or holding a NUL", f"{_p(path, name)}[{i}]",
                                  f"at most {MAX_ARG_LEN} characters, no NUL", f"{len(word)} characters")
        if self.command and not self.command[0]:
            raise Invalid("empty program name", _p(path, "command") + "[0]", "a program", "''")
        if len(self.env) > MAX_ENV:
            raise Invalid("too many environment variables", _p(path, "env"), f"at most {MAX_ENV}", str(len(self.env)))
        for name, value in self.env.items():
            where = f"{_p(path, 'env')}.{name[:40]}"
            if not ENV_NAME.fullmatch(name):
                raise Invalid("not an environment variable name", where, "[A-Za-z_][A-Za-z0-9_]*", name[:80])
            if name.startswith(RESERVED_ENV_PREFIX):
                raise Invalid("RUBICK_ variables are set by the launcher", where, "another name", name[:80])
            if not isinstance(value, str):
                raise Invalid("wrong type", where, "string", type(value).__name__)
            if len(value) > MAX_ARG_LEN or "\x00" in value:
                raise Invalid("value too long or holding a NUL", where, f"at most {MAX_ARG_LEN} characters, no NUL",
                              f"{len(value)} characters")

    @property
    def argv(self) -> tuple[str, ...]:
        return self.command + self.args


def support_of(workload: Workload | None) -> PlanSupport:
    """What a job's training code runs: the example trainer's, or what its workload declares."""
    if workload is None:
        return EXAMPLE_TRAINER
    return workload.supports if workload.supports is not None else DATA_PARALLEL_ONLY


def _p(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name

