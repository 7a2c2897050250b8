"""`rubick` imports only the module of the command given: `rubick --help` lists every command from the
`COMMANDS` table, which must stay equal to what the modules register, and a command never loads the
heavy parts it does not use (the simulator, the policy, scipy, polars, torch)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.cli import COMMANDS, build_parser, parser_for

REPO = Path(__file__).resolve().parents[2]

HEAVY = ("polars", "scipy", "torch", "deepspeed", "policy", "replay", "modeler", "agents", "prometheus_client",
         "kubernetes", "numpy", "nats", "aiohttp", "multidict")


def test_the_command_table_is_what_the_modules_register():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert {k: v[1] for k, v in COMMANDS.items()} == registered
    for name in COMMANDS:  # the module named registers the command itself
        own = next(a for a in parser_for(name)._actions if isinstance(a, argparse._SubParsersAction))
        assert name in own.choices, f"{COMMANDS[name][0]} does not register {name}"


def loaded(*argv: str) -> set[str]:
    """Top-level packages imported by `rubick ARGV` (run in a fresh interpreter, stopped after parsing)."""
    code = ("import sys, json\nfrom controlplane.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True, timeout=60)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv, allowed", [
    (("--help",), ()),
    (("nonsense",), ()),
    (("submit", "--help"), ("nats",)),
    (("cancel", "--help"), ("nats",)),
    (("simulate", "--help"), ("replay",)),  # neither a simulation nor a replay talks to NATS
    (("replay", "--help"), ("replay",)),
])
def test_a_command_loads_only_what_it_uses(argv, allowed):
    heavy = loaded(*argv) & set(HEAVY)
    assert heavy <= set(allowed), f"rubick {' '.join(argv)} imported {sorted(heavy - set(allowed))}"
