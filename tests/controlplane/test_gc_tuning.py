"""The `rubick` process raises the garbage collector's thresholds before it runs a command."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from controlplane.gc_tuning import OLDER, YOUNG, tune

REPO = Path(__file__).resolve().parents[2]


def test_a_command_runs_with_the_raised_thresholds():
    code = ("import gc, json, sys\nfrom controlplane.cli import main\nbefore = gc.get_threshold()\n"
            "main(['schema', 'job.cancel'])\nprint(json.dumps([before, gc.get_threshold()]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before[0] < YOUNG and after == [YOUNG, *OLDER]


def test_tune_never_lowers_a_threshold_nor_turns_collection_on():
    saved = gc.get_threshold()
    try:
        gc.set_threshold(YOUNG * 2, 5, 500)
        tune()
        assert gc.get_threshold() == (YOUNG * 2, 5, 500)
        gc.set_threshold(0)
        tune()
        assert gc.get_threshold()[0] == 0
        gc.set_threshold(700, 10, 10)
        tune()
        assert gc.get_threshold() == (YOUNG, *OLDER)
    finally:
        gc.set_threshold(*saved)
