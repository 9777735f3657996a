"""Waiting for a launched trial in tests: poll until it ends; a trial still running at the deadline is stopped
(so it cannot outlive the test) and the test fails."""

from __future__ import annotations

import time

from mart.state.trials import TrialPoll


def wait_finished(runner, handle, timeout_s: float = 60.0, *, every_s: float = 0.05) -> TrialPoll:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        poll = runner.poll(handle)
        if poll.status.is_finished():
            return poll
        time.sleep(every_s)
    runner.stop(handle, "test timeout", grace_s=0.5)
    raise AssertionError(f"{handle.trial_id} did not finish within {timeout_s} s")
