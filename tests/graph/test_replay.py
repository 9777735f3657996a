"""Recorded sessions replay exactly: the stage protocol and the parallel graph change nothing a user sees of a
one-slot session (same trials, reviews, health events and summary for the same seeds).

The oracle is the fingerprint each session had on the code before both (``tests/support/recorded.py``),
on the toy plugin, the simulator's poll clock and the local CPU workload's stage 2.
"""

from __future__ import annotations

import pytest

from tests.support.recorded import SESSIONS, load, run_session


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_recorded_session_replays(name, tmp_path, monkeypatch):
    if name.startswith("local"):
        monkeypatch.setenv("MART_CACHE_DIR", str(tmp_path / "cache"))
    got = run_session(name, tmp_path / "runs")
    want = load(name)
    # one part at a time, so a failure names what changed
    for part in ("trials", "reviews", "health_events", "proposals", "summary"):
        assert got[part] == want[part], f"{name}: {part} differ from the recording"
