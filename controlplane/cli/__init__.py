"""The `rubick` command line.

Each package contributes its commands through a `register(subparsers)` function in
its own `cli` module (`controlplane.cli.*`, `modeler.cli`, `policy.cli`,
`replay.cli`, `agents.cli`); a command's handler is `args.func(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = (
    "controlplane.cli.up",
    "controlplane.cli.submit",
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rubick", description="Rubick control plane for shared DL clusters")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that package has no commands yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
