"""The `rubick` command line.

Each package contributes its commands through a `register(subparsers)` function in
its own `cli` module (`controlplane.cli.*`, `modeler.cli`, `policy.cli`,
`replay.cli`, `agents.cli`); a command's handler is `args.func(args) -> int`.
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


def _deepest(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser the words of `argv` lead to: `rubick log show ...` -> the `show` parser."""
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and word in subs[0].choices:
            parser = subs[0].choices[word]
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(words)
    if extra:  # a mistyped flag: the usage of the command it was given to, not the top level's
        _deepest(parser, words).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        _deepest(parser, words).print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `rubick log show ... | head`: the reader has all it wants
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout at exit
        return 141


if __name__ == "__main__":
    sys.exit(main())
