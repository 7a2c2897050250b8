"""NATS unreachable for a minute (RUBICK_FAULT_OUTAGE_S shortens it locally): a real `rubick agent
--cpu-devices 2 --min-iteration-s 1` trains the example trainer on the CPU, an iteration a second, while separate
`rubick service` processes run on an open nats-server on 127.0.0.1; the server is stopped and started again on the
same store and port. The agent and the training go on, the reporter buffers, and afterwards every iteration is in the
log exactly once; a cancel sent through the restarted server stops the job where the agent says it stopped, and
the log passes the fault matrix's checks (outage.py)."""

from __future__ import annotations

import pytest

from .outage import PACE_S, outage_seconds, run_outage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def test_nats_away_for_a_minute_training_goes_on_and_everything_catches_up(tmp_path):
    outage = outage_seconds()
    outcome = await run_outage(tmp_path, outage)
    assert outcome.outage_s >= outage, outcome.notes
    assert outcome.agent_alive, "the agent did not live through the outage"
    assert outcome.trained_during > 0, "training stopped while NATS was away"
    assert outcome.trained_after > 0, "no iteration made after the outage reached the log"
    assert outcome.stop_reason == "cancelled" and outcome.stopped_at > 0, outcome
    assert outcome.reported == list(range(outcome.stopped_at)), "an iteration is missing or reported twice"
    assert outcome.lost == 0 and outcome.duplicates == 0 and outcome.gaps == 0, outcome
    assert outcome.state_equal, outcome.notes
    assert outcome.replay_rc == 0
    # the trainer kept its floor of PACE_S an iteration: over the run, the mean time between iterations (one iteration's
    # work may fall either side of a floor's sleep, hence the allowance)
    times = outcome.reported_at
    assert len(times) > 2 and (times[-1] - times[0]) / (len(times) - 1) >= 0.95 * PACE_S, times
    assert outcome.survived
