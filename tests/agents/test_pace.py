"""The example trainer's floor on an iteration's wall time (`min_iteration_s`, `rubick agent --min-iteration-s`):
what it accepts, what it refuses with the reason, and that an iteration shorter than the floor is slept up to it.
A run under the floor end to end: `tests/faults/test_outage.py` (a real agent trains through a NATS outage at one
iteration a second, and the log's iteration times say so)."""

from __future__ import annotations

import math
import time

import pytest

from agents.cli import run_agent
from tests.agents.test_traffic_class import agent_args


def test_the_floor_from_the_run_file():
    from examples.trainer.train import iteration_floor

    assert iteration_floor({}) == 0.0
    assert iteration_floor({"min_iteration_s": None}) == 0.0
    assert iteration_floor({"min_iteration_s": 0}) == 0.0
    assert iteration_floor({"min_iteration_s": 0.25}) == 0.25
    assert iteration_floor({"min_iteration_s": "1.5"}) == 1.5
    for bad in (-0.1, math.nan, math.inf, "soon", True, [1]):
        with pytest.raises(SystemExit, match=r"min_iteration_s = .* give a number of seconds, 0 or more"):
            iteration_floor({"min_iteration_s": bad})


def test_an_iteration_under_the_floor_is_slept_up_to_it(monkeypatch):
    from examples.trainer import train

    began = time.monotonic()
    time.sleep(0.05)  # the iteration's work
    train.rest(began, 0.3)
    assert time.monotonic() - began >= 0.3
    slept = []
    monkeypatch.setattr(train.time, "sleep", slept.append)
    train.rest(time.monotonic() - 0.5, 0.3)  # an iteration longer than the floor
    train.rest(time.monotonic(), 0.0)  # no floor
    assert slept == []
    train.rest(time.monotonic() - 0.1, 0.3)
    assert len(slept) == 1 and 0 < slept[0] <= 0.2


def test_the_agent_refuses_a_floor_that_is_not_a_number_of_seconds(capsys):
    assert agent_args("--min-iteration-s", "0.5").min_iteration_s == 0.5
    assert agent_args().min_iteration_s == 0.0
    for bad in ("-1", "nan", "inf"):
        capsys.readouterr()
        assert run_agent(agent_args("--min-iteration-s", bad)) != 0
        assert "--min-iteration-s must be a number of seconds, 0 or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        agent_args("--min-iteration-s", "soon")
    capsys.readouterr()
