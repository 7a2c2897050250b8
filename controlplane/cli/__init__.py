"""The `rubick` command line.

Each package contributes its commands through a `register(subparsers)` function in
its own `cli` module (`controlplane.cli.*`, `modeler.cli`, `policy.cli`,
`replay.cli`, `agents.cli`); a command's handler is `args.func(args) -> int`.

Only the module of the command given is imported (`COMMANDS` names it): `rubick --help` lists the
commands from that table without importing any of them, and `rubick submit` never loads the
simulator, the policy or scipy. A test keeps the table equal to what the modules register.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMAND_MODULES = (
    "controlplane.cli.up",
    "controlplane.cli.submit",
    "controlplane.cli.jobs",
    "controlplane.cli.quota",
    "controlplane.cli.models",
    "controlplane.cli.schema",
    "controlplane.cli.log",
    "controlplane.cli.status",
    "controlplane.cli.demo",
    "controlplane.cli.service",
    "controlplane.cli.auth",
    "modeler.cli",
    "policy.cli",
    "replay.cli",
    "agents.cli",
)


COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("controlplane.cli.up", "run the control plane (embedded NATS + JetStream, recorder, admission, clock)"),
    "submit": ("controlplane.cli.submit", "validate job files and publish job.submitted"),
    "cancel": ("controlplane.cli.jobs", "cancel a job (it is cancelled)"),
    "suspend": ("controlplane.cli.jobs", "suspend a job (it is suspended)"),
    "resume": ("controlplane.cli.jobs", "resume a job (it is resumed)"),
    "priority": ("controlplane.cli.jobs", "change a job's priority (-1000..1000, default 0; higher runs first and may "
                                          "shrink lower ones)"),
    "quota": ("controlplane.cli.quota", "tenants' quotas of guaranteed GPUs: set one, or show them with their use"),
    "models": ("controlplane.cli.models", "the model types a job may name (built-in, and new ones submitted with a "
                                          "spec)"),
    "schema": ("controlplane.cli.schema", "print the JSON Schema of a subject's messages"),
    "log": ("controlplane.cli.log", "inspect the Parquet event log"),
    "status": ("controlplane.cli.status", "nodes, jobs, allocations and plans (from the log or live)"),
    "demo": ("controlplane.cli.demo", "run the control plane end to end on this machine and show the result"),
    "service": ("controlplane.cli.service", "run one service against a NATS deployment"),
    "auth": ("controlplane.cli.auth", "credentials and permissions of the deployment's identities"),
    "model": ("modeler.cli", "fit, predict and validate the performance model"),
    "explain": ("policy.cli", "why a job got its allocation and plan (curves, min_res, plans considered)"),
    "simulate": ("replay.cli", "simulate a trace on a virtual cluster with the real cores"),
    "report": ("replay.cli", "compare simulated runs: table and plots"),
    "replay": ("replay.cli", "check a recorded run's decisions byte for byte, or replay it as a what-if"),
    "agent": ("agents.cli", "run the node agent: register, heartbeat, carry out plan.decided"),
    "profile": ("agents.cli", "measure a model type's configurations here, for `rubick model fit`"),
}
"""command -> (the module that registers it, its one-line help), in the order `rubick --help` lists them."""

BATCH = frozenset({"simulate", "replay", "report"})
"""commands that run to an end without serving anything: their process runs with the garbage collector off, from
the start to the exit (which then walks no heap either). The cores a simulation or a check runs make no reference
cycles (`controlplane.gc_tuning`); what else such a process makes is freed as it exits. Every other command raises
the collector's thresholds (`controlplane.gc_tuning.tune`)."""


def _parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = argparse.ArgumentParser(prog="rubick", description="Rubick control plane for shared DL clusters")
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND")


def command_list_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command by name and help only (nothing imported): for `rubick`,
    `rubick --help` and a command that does not exist."""
    parser, sub = _parser()
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def parser_for(command: str) -> argparse.ArgumentParser:
    """The parser of one command: its module alone is imported and registers its commands."""
    parser, sub = _parser()
    importlib.import_module(COMMANDS[command][0]).register(sub)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """Every command, every module imported (for tests and documentation)."""
    parser, sub = _parser()
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that package has no commands yet
                continue
            raise
        module.register(sub)
    return parser


def _deepest(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser the words of `argv` lead to: `rubick log show ...` -> the `show` parser."""
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and word in subs[0].choices:
            parser = subs[0].choices[word]
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` names (None: the program's own arguments, as `rubick` and `python -m controlplane.cli`
    run it). A `BATCH` command run as the program leaves the collector off to the exit; given `argv` (a caller in
    the same process), it switches the collector back on as it was."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    parser = parser_for(command) if command in COMMANDS else command_list_parser()
    args, extra = parser.parse_known_args(words)
    if extra:  # a mistyped flag: the usage of the command it was given to, not the top level's
        _deepest(parser, words).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        _deepest(parser, words).print_help()
        return 2
    import gc

    from controlplane.gc_tuning import tune
    batch, was = command in BATCH, gc.isenabled()
    if batch:  # no reference cycles to free (controlplane/gc_tuning.py), and no heap walked at the exit either
        gc.disable()
    else:
        tune()  # long runs (the services) spend less time in the garbage collector
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `rubick log show ... | head`: the reader has all it wants
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout at exit
        return 141
    finally:
        if batch and was and argv is not None:
            gc.enable()


if __name__ == "__main__":
    sys.exit(main())
