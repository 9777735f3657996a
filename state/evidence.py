"""The evidence behind a stage-1 verdict: a trial's own spread, whether a measurement was disturbed, and the gain
of the incumbent over the baseline from their interleaved re-measurement.

Pure functions of metric records (the policy that acts on them is ``mart.nodes.stages.system``):

* ``window_throughputs``: the per-step throughputs a trial's figure is the mean of (its spread is its noise).
* ``phase_noise`` / ``disturbed_phases``: each phase's step-to-step noise, pooled over the stage's trials, and the
  phases a candidate's changed knobs do not act on (``ParamSpec.acts_on``) that moved against the baseline by more
  than that noise allows. The machine, not the knob, moved those: the measurement is not believed.
* ``remeasured_gain``: the gain of the incumbent over the baseline from fresh re-measurements run interleaved
  (baseline, incumbent, baseline, incumbent ...), as an interval on the log scale
  (``mart.state.stats.rounds_gain_interval``). A pair is the same step of the two trials of one round: the two
  ran back to back on the same seed, so they saw the same prompts (the same workload) and the same drift of the
  machine, which the per-pair ratio cancels. What a pair does not cancel is each trial's own luck on a shared
  machine; the rounds' spread measures it, and the interval widens by it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mart.state.metrics import StepRecord, compared_phase_times, step_throughput
from mart.state.stats import LEVEL, Interval, relative_spread, rounds_gain_interval

#: a phase name as a trainer writes one: metric keys come from a trial's own log (untrusted), and a disturbed
#: phase's name reaches the ledger, the notes and the terminal, so any other key is not read as a phase
_PHASE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: ``timing_s/`` names that are totals or not phases
NOT_PHASES = frozenset({"step", "testing", "save_checkpoint"})

#: a phase below this share of the baseline's step time is not judged (its relative jitter says little)
MIN_PHASE_SHARE = 0.05
#: a phase moved beyond its noise: its mean time changed by more than ``DISTURB_Z`` standard errors of the
#: difference (each phase's step-to-step noise, pooled over the stage's trials), and by at least ``DISTURB_FLOOR``
#: (a knob's side effects on a phase it does not name stay below that on the simulator; issue 43's example: +51%)
DISTURB_Z = 4.0
DISTURB_FLOOR = 0.15


def window_throughputs(records: Sequence[StepRecord], first: int, last: int) -> dict[int, float]:
    """step -> the throughput compared at that step (``step_throughput``: the backend's compared clock where it
    writes one, e.g. the local trainer's CPU time), over ``first..last`` (finite, positive values only)."""
    out: dict[int, float] = {}
    for r in records:
        v = step_throughput(r)
        if first <= r.step <= last and math.isfinite(v) and v > 0:
            out[r.step] = v
    return out


def phase_times(records: Sequence[StepRecord], first: int, last: int) -> dict[str, list[float]]:
    """phase -> its times over steps ``first..last`` (each ``timing_s/<phase>`` the step logged, read on the clock
    its throughput is compared on: ``compared_phase_times``; finite and positive)."""
    out: dict[str, list[float]] = {}
    for r in records:
        if not first <= r.step <= last:
            continue
        for name, v in compared_phase_times(r).items():
            if name not in NOT_PHASES and _PHASE_NAME.match(name) and math.isfinite(v) and v > 0:
                out.setdefault(name, []).append(v)
    return out


def _log_var(xs: Sequence[float]) -> tuple[float, int] | None:
    if len(xs) < 2:
        return None
    logs = [math.log(x) for x in xs]
    m = sum(logs) / len(logs)
    return sum((v - m) ** 2 for v in logs) / (len(logs) - 1), len(logs) - 1


def phase_noise(trials: Iterable[Sequence[StepRecord]], first: int, last: int) -> dict[str, float]:
    """phase -> its step-to-step noise (the standard deviation of log time within a trial), pooled over
    ``trials`` (each trial's own variance, weighted by its degrees of freedom): several short trials together
    estimate a phase's noise far better than two of them."""
    acc: dict[str, list[float]] = {}
    for records in trials:
        for phase, xs in phase_times(records, first, last).items():
            v = _log_var(xs)
            if v is not None:
                s = acc.setdefault(phase, [0.0, 0.0])
                s[0] += v[0] * v[1]
                s[1] += v[1]
    return {p: math.sqrt(s / d) for p, (s, d) in acc.items() if d > 0}


@dataclass(frozen=True)
class PhaseMove:
    """A phase that moved beyond its noise although no changed knob acts on it."""

    phase: str
    change: float  # relative change of its mean time against the baseline's (+0.51: 51% slower)
    bar: float  # the relative change its noise allows

    def describe(self) -> str:
        return f"{self.phase} {self.change:+.0%} (noise allows {self.bar:.0%})"


def disturbed_phases(baseline: Sequence[StepRecord], candidate: Sequence[StepRecord], acts_on: Iterable[str] | None,
                     noise: dict[str, float], first: int, last: int) -> list[PhaseMove]:
    """The phases of ``candidate`` that none of its changed knobs act on (``acts_on``: the union of their
    ``ParamSpec.acts_on``; None or ``"all"`` in it: every phase may move, nothing is judged) whose mean time over
    ``first..last`` moved against the baseline's beyond ``max(DISTURB_FLOOR, DISTURB_Z x its noise)``. A phase
    below ``MIN_PHASE_SHARE`` of the baseline's step, or without a noise estimate, is not judged."""
    touched = set(acts_on or ("all",))
    if "all" in touched:
        return []
    base, cand = phase_times(baseline, first, last), phase_times(candidate, first, last)
    total = sum(sum(xs) / len(xs) for xs in base.values())
    out = []
    for phase in sorted(set(base) & set(cand) - touched):
        b, c = base[phase], cand[phase]
        mb, mc = sum(b) / len(b), sum(c) / len(c)
        if total <= 0 or mb / total < MIN_PHASE_SHARE or phase not in noise:
            continue
        se = noise[phase] * math.sqrt(1 / len(b) + 1 / len(c))
        bar = max(math.log1p(DISTURB_FLOOR), DISTURB_Z * se)
        moved = math.log(mc / mb)
        if abs(moved) > bar:
            out.append(PhaseMove(phase, math.expm1(moved), math.expm1(bar)))
    return out


def remeasured_gain(rounds: Sequence[tuple[dict[int, float], dict[int, float]]], level: float = LEVEL
                    ) -> Interval | None:
    """The incumbent's gain over the baseline from interleaved re-measurement rounds, each ``(baseline's step ->
    throughput, incumbent's step -> throughput)``: the log ratios of the same step of the two trials of a round,
    within rounds and across them (``rounds_gain_interval``: the rounds' spread beyond their step noise is the
    machine's trial-to-trial noise, which one round's pairs cannot show). None without a single pair."""
    aligned = []
    for base, inc in rounds:
        steps = sorted(set(base) & set(inc))
        if steps:
            aligned.append(([base[s] for s in steps], [inc[s] for s in steps]))
    if not aligned:
        return None
    return rounds_gain_interval(aligned, level=level)


def spread_pct(samples: Iterable[float]) -> float | None:
    """A trial's own noise: the coefficient of variation of its per-step throughputs, in percent (None below
    two steps)."""
    cv = relative_spread(list(samples))
    return None if cv is None else round(100 * cv, 2)
