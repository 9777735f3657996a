"""The progress watchdog: when a trial that makes no progress is stopped as hung (or frozen).

One rule for every backend. The watch tool (``mart.tools.watch``) applies it to each trial in flight; runners
that follow their own processes (verl, MARTI, Ray jobs: ``TrialRunner.watches_progress``) apply the same rule in
their ``poll``, where they also learn the start-up times it derives its first-step limit from.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mart.state.metrics import StepRecord

#: first-step timeout before any start-up was measured, and the floor of the derived one (seconds).
DEFAULT_FIRST_STEP_TIMEOUT_S = 3600.0
DERIVED_FIRST_STEP_FLOOR_S = 600.0


@dataclass
class WatchdogConfig:
    """When a run that makes no progress is killed.

    Before the first training step: ``first_step_timeout_s`` after launch (model load, vLLM start, the
    step-0 validation and step 1); None = derived: ``max(600, 3 x`` the slowest start-up this runner has
    measured``)``, or 1 h before any was measured. Afterwards: no new step within ``stall_timeout_s`` when
    set, else ``max(min_step_timeout_s, k x expected)`` where ``expected`` is ``expected_step_s`` or, when
    None, the median ``timing_s/step`` the run logged (else its mean time per step so far).
    ``--backend-option stall_timeout_s=900 --backend-option first_step_timeout_s=5400`` set them for a session.
    """

    enabled: bool = True
    first_step_timeout_s: float | None = None
    k: float = 5.0
    min_step_timeout_s: float = 300.0
    expected_step_s: float | None = None
    stall_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if (self.k <= 0 or (self.first_step_timeout_s is not None and self.first_step_timeout_s <= 0)
                or self.min_step_timeout_s < 0 or (self.stall_timeout_s is not None and self.stall_timeout_s <= 0)):
            raise ValueError(f"watchdog: `k > 0`, `first_step_timeout_s > 0`, `stall_timeout_s > 0` and "
                             f"`min_step_timeout_s >= 0` must hold, but got ({self.k=}, {self.first_step_timeout_s=}, "
                             f"{self.stall_timeout_s=}, {self.min_step_timeout_s=}).")

    def first_step_limit(self, measured_startups_s: Sequence[float] = ()) -> float:
        """The first-step timeout: the configured one, else derived from start-ups measured so far."""
        if self.first_step_timeout_s is not None:
            return self.first_step_timeout_s
        if measured_startups_s:
            return max(DERIVED_FIRST_STEP_FLOOR_S, 3.0 * max(measured_startups_s))
        return DEFAULT_FIRST_STEP_TIMEOUT_S


@dataclass
class Progress:
    """Training progress of one run as seen by a poller, and the watchdog's verdict on it."""

    last_step: int | None = None
    first_train_seen_at: float | None = None
    last_progress_at: float | None = None
    step_times: list[float] = field(default_factory=list)

    def observe(self, records: Iterable[StepRecord], now: float | None = None) -> None:
        now = time.time() if now is None else now
        for r in records:
            if self.last_step is None or r.step > self.last_step:
                self.last_step = r.step
                if r.step >= 1:  # step 0 is the pre-training validation, not training progress
                    self.last_progress_at = now
                    if self.first_train_seen_at is None:
                        self.first_train_seen_at = now
            t = r.get("timing_s/step")
            if not math.isnan(t) and t > 0:
                self.step_times.append(t)

    def expired(self, wd: WatchdogConfig, started_at: float, now: float | None = None,
                startups_s: Sequence[float] = ()) -> str | None:
        """A reason when the run is hung by ``wd``'s rules, else None."""
        if not wd.enabled:
            return None
        now = time.time() if now is None else now
        if self.last_progress_at is None:
            first = wd.first_step_limit(startups_s)
            if now - started_at > first:
                return (f"watchdog: no training step within {first:.0f} s of launch (last step {self.last_step}; "
                        "set --backend-option first_step_timeout_s=SECONDS if start-up is that slow); killed as hung")
            return None
        if wd.stall_timeout_s is not None:
            idle = now - self.last_progress_at
            if idle > wd.stall_timeout_s:
                return (f"watchdog: no new step for {idle:.1f} s after step {self.last_step} (stall_timeout_s "
                        f"{wd.stall_timeout_s:g}); killed as hung")
            return None
        if wd.expected_step_s is not None:
            expected = wd.expected_step_s
        elif self.step_times:
            expected = sorted(self.step_times)[len(self.step_times) // 2]
        else:
            n = max(1, self.last_step or 1)
            expected = (self.last_progress_at - (self.first_train_seen_at or started_at)) / max(1, n - 1)
        limit = max(wd.min_step_timeout_s, wd.k * expected)
        idle = now - self.last_progress_at
        if idle > limit:
            return (f"watchdog: no new step for {idle:.1f} s after step {self.last_step} (limit {limit:.1f} s = "
                    f"max({wd.min_step_timeout_s:g}, {wd.k:g} x expected {expected:.2f} s)); killed as hung")
        return None
