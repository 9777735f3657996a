"""The session's overall ETA: what remains of the whole session, from the stages' trial budgets and the step times
measured so far (the console's progress prints it beside each trial's own ETA).

Each stage still to run contributes its unlaunched trials x their steps, and each running trial its steps left;
steps are timed by the stage's own measured seconds per step (a trial's wall clock over its steps, start-up
included), or the last measured stage's before a stage has any. The work is spread over the slots. Re-runs on
another seed (stage 2's of close contenders, stage 1's re-measurement of its best beside the baseline;
``StagePolicy.max_reruns``) happen only when needed, so they make the upper end of a range.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from mart.state.options import TuneOptions
from mart.state.stages import traits


@dataclass
class _Running:
    stage: str
    horizon: int
    started: float
    step: int = 0


@dataclass
class SessionEta:
    """Follows the session's trials (launches, steps, ends) and estimates the time the session has left."""

    options: TuneOptions
    slots: int = 1
    launched: dict[str, int] = field(default_factory=dict)  # stage -> trials launched that use its budget
    confirms: dict[str, int] = field(default_factory=dict)  # stage -> its re-runs (``confirm`` trials) launched
    running: dict[str, _Running] = field(default_factory=dict)
    per_step: dict[str, list[float]] = field(default_factory=dict)  # stage -> measured seconds per step
    last_stage: str | None = None
    clock: Any = time.monotonic
    _stage_reached: int = 0  # the index (in options.stages) of the latest stage a trial was launched in

    @classmethod
    def for_session(cls, options: TuneOptions, trials: list[dict[str, Any]] | None = None) -> "SessionEta":
        """The estimate for ``options``; a resumed session counts the trials its ledger already holds."""
        eta = cls(options=options, slots=max(1, options.parallel))
        for t in trials or []:
            eta._count(t["stage"], t.get("kind") or "candidate")
            steps, wall = t.get("steps_done") or 0, t.get("wall_s") or 0.0
            if t.get("status") != "running" and steps > 0 and wall > 0:
                eta.per_step.setdefault(t["stage"], []).append(wall / steps)
                eta.last_stage = t["stage"]
        return eta

    def _count(self, stage: str, kind: str) -> None:
        if stage in self.options.stages:
            self._stage_reached = max(self._stage_reached, self.options.stages.index(stage))
        if kind == "confirm":  # a re-run on another seed, beside the stage's budget
            self.confirms[stage] = self.confirms.get(stage, 0) + 1
        else:
            self.launched[stage] = self.launched.get(stage, 0) + 1

    # -- what the session reports -----------------------------------------------------------------------------
    def launched_trial(self, trial_id: str, stage: str, kind: str, horizon: int, slots: int) -> None:
        self._count(stage, kind)
        self.slots = max(1, slots)
        self.running[trial_id] = _Running(stage, horizon, self.clock())

    def step(self, trial_id: str, step: int) -> None:
        if trial_id in self.running:
            self.running[trial_id].step = max(self.running[trial_id].step, step)

    def ended(self, trial_id: str) -> None:
        r = self.running.pop(trial_id, None)
        if r is not None and r.step > 0:
            self.per_step.setdefault(r.stage, []).append((self.clock() - r.started) / r.step)
            self.last_stage = r.stage

    # -- the estimate ---------------------------------------------------------------------------------------
    def _seconds_per_step(self, stage: str) -> float | None:
        now = self.clock()
        own = list(self.per_step.get(stage, []))
        own += [(now - r.started) / r.step for r in self.running.values() if r.stage == stage and r.step > 0]
        if own:
            return statistics.median(own)
        if self.last_stage is not None:
            return statistics.median(self.per_step[self.last_stage])
        return None

    def _stage_plan(self, stage: str) -> tuple[int, int]:
        """(trials its budget still allows, steps each)."""
        from mart.nodes.stages import get as stage_policy  # the policies: only once a trial has been timed

        o, policy = self.options, stage_policy(stage)
        horizon = policy.horizon(o)
        if traits(stage).branches:  # a segment-trial runs one segment: T / S steps on average
            horizon = max(1, round(horizon / o.schedule_segments))
        return max(0, policy.budget(o) - self.launched.get(stage, 0)), horizon

    def remaining_s(self) -> tuple[float, float, int, int] | None:
        """(seconds left without stage 2's re-runs, with all of them, trials still to launch, re-runs it may still
        make), or None before any step was timed."""
        low = high = 0.0
        to_launch = reruns = 0
        # a stage before the one the latest trial was launched in is over, whatever its budget left
        current = max((self.options.stages.index(r.stage) for r in self.running.values()
                       if r.stage in self.options.stages), default=0)
        current = max(current, self._stage_reached)
        for i, stage in enumerate(self.options.stages):
            if i < current or not self.options.runs_stage(stage):
                continue
            per_step = self._seconds_per_step(stage)
            if per_step is None:
                return None
            left, horizon = self._stage_plan(stage)
            steps = left * horizon + sum(max(0, r.horizon - r.step) for r in self.running.values() if r.stage == stage)
            low += steps * per_step
            to_launch += left
            # stage 2's re-runs of close contenders, stage 1's re-measurement of its best beside the baseline
            from mart.nodes.stages import get as stage_policy

            more = max(0, stage_policy(stage).max_reruns(self.options) - self.confirms.get(stage, 0))
            reruns += more
            high += more * horizon * per_step
        return low / self.slots, (low + high) / self.slots, to_launch, reruns

    def text(self) -> str:
        """``session: about 5-6 min left (4 trial(s) to launch and up to 1 re-run(s) on a second seed)``; empty
        before any step was timed."""
        est = self.remaining_s()
        if est is None:
            return ""
        low, high, to_launch, reruns = est
        lo, hi = _minutes(low), _minutes(high)
        span = lo if lo == hi else f"{lo}-{hi}"
        what = [f"{to_launch} trial(s) to launch"] if to_launch else []
        what += [f"up to {reruns} re-run(s) on a second seed"] if reruns else []
        return f"session: about {span} min left ({' and '.join(what) or 'the trials running'})"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}" if seconds >= 90 else f"{seconds / 60:.1f}"
