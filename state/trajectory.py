"""One reader of a trial's metric stream: series by key (with fallbacks), per-agent streams, windows, slopes.

Every analyser of a trajectory reads through it: the health rules (``mart.state.health``), the stage-3
diagnosis (``mart.nodes.agents.schedule.diagnose``) and the stage-2 collapse signals and validation noise
(``mart.state.objectives``). The records are verl's step records (``StepRecord``), a multi-agent job's with each
agent's metrics under ``agent<i>/`` (``mart.state.agents``).

A series is a list of ``(step, value)`` points in record order. Two kinds of fallback between keys:

- ``series("actor/ppo_kl", "actor/kl_loss")``: per step, the first key that step holds (the health rules: a
  stream that renamed its memory metric mid-run still reads as one);
- ``first_series(("actor/kl_loss", "actor/ppo_kl"))``: the whole series of the first key that has any point
  (the diagnosis: ``kl_loss`` when the run has a KL loss, else ``ppo_kl``, never a mix of the two).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from mart.state.agents import agent_stream, agents_in_records
from mart.state.metrics import StepRecord

Point = tuple[int, float]
Keep = Callable[[float], bool]


def not_nan(v: float) -> bool:
    return not math.isnan(v)


class Trajectory:
    """A trial's step records (kept in the order given; ``sorted_by_step`` orders them)."""

    def __init__(self, records: Iterable[StepRecord]) -> None:
        self.records: list[StepRecord] = list(records)

    def sorted_by_step(self) -> Trajectory:
        return Trajectory(sorted(self.records, key=lambda r: r.step))

    def __len__(self) -> int:
        return len(self.records)

    # -- series -------------------------------------------------------------------------------------
    def series(self, *keys: str, since: int | None = None, keep: Keep | None = None) -> list[Point]:
        """(step, value) of every record holding one of ``keys``: per record the first of them it holds (with
        ``keep``: the first whose value passes it); records before step ``since`` are left out."""
        out = []
        for r in self.records:
            if since is not None and r.step < since:
                continue
            for k in keys:
                if k in r.data and (keep is None or keep(r.data[k])):
                    out.append((r.step, r.data[k]))
                    break
        return out

    def first_series(self, keys: Sequence[str] | str, keep: Keep = math.isfinite) -> list[Point]:
        """The series of the first of ``keys`` with a point that passes ``keep`` (finite by default), only
        those points: one key for the whole stream."""
        for key in (keys,) if isinstance(keys, str) else keys:
            pts = [(r.step, r.data[key]) for r in self.records if key in r.data and keep(r.data[key])]
            if pts:
                return pts
        return []

    def prefixed(self, prefix: str, keep: Keep = not_nan) -> list[Point]:
        """Per record, the first key under ``prefix`` (in the record's order) whose value passes ``keep``:
        the validation score of each step that validated, whatever the dataset's name (``val-core/...``)."""
        out = []
        for r in self.records:
            for k, v in r.data.items():
                if k.startswith(prefix) and keep(v):
                    out.append((r.step, v))
                    break
        return out

    def first_key(self, prefix: str, keep: Keep = math.isfinite) -> str | None:
        """The first key under ``prefix`` with a value that passes ``keep`` (records in order, keys sorted)."""
        return next((k for r in self.records for k in sorted(r.data) if k.startswith(prefix) and keep(r.data[k])),
                    None)

    # -- agents ---------------------------------------------------------------------------------------
    def agents(self) -> list[int]:
        """The agents that log their own metrics (``agent<i>/...``), ascending; empty for a single-agent job."""
        return agents_in_records(self.records)

    def agent(self, agent: int) -> Trajectory:
        """One agent's stream under verl's names (the ``agent<i>/`` prefix stripped), so that every
        single-stream reader reads it as it reads a single-agent job."""
        return Trajectory(agent_stream(self.records, agent))


# -- windows and slopes over a series ---------------------------------------------------------------------
def tail(pts: Sequence[Point], window: int) -> list[Point]:
    """The points of the last ``window`` steps (by step number; at least the last point)."""
    if not pts:
        return []
    last = pts[-1][0]
    return [p for p in pts if p[0] > last - window] or list(pts[-1:])


def mean(pts: Sequence[Point]) -> float:
    return sum(v for _, v in pts) / len(pts)


def line_fit(pts: Sequence[Point]) -> tuple[float, float, float, float]:
    """Least squares of value on step: (mean step, mean value, sum of squared step deviations, slope; 0 when
    every point has the same step)."""
    xs, ys = [float(s) for s, _ in pts], [v for _, v in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return mx, my, sxx, slope


def rel_slope(pts: Sequence[Point]) -> float | None:
    """Least-squares slope per step divided by the mean magnitude (relative change per step); None with fewer
    than two steps."""
    if len(pts) < 2:
        return None
    _, _, sxx, slope = line_fit(pts)
    if sxx == 0:
        return None
    scale = sum(abs(v) for _, v in pts) / len(pts)
    return slope / scale if scale > 1e-12 else 0.0


def residual_std(pts: Sequence[Point]) -> float:
    """Std of the residuals around the least-squares line (n - 2 degrees of freedom; needs 3+ points)."""
    mx, my, _, slope = line_fit(pts)
    rss = sum((v - (my + slope * (float(s) - mx))) ** 2 for s, v in pts)
    return math.sqrt(rss / (len(pts) - 2))


def persisting(pts: Sequence[Point], bad: Keep, window: int) -> int:
    """How long ``bad`` has held: the longest run anywhere when it reached ``window`` (several new steps can
    arrive in one read, and an anomaly that persisted for a window inside them still counts), else the run of
    trailing steps (0 when the newest step is fine)."""
    longest = run = 0
    for _, v in pts:
        run = run + 1 if bad(v) else 0
        longest = max(longest, run)
    return longest if longest >= window else run


def trailing(pts: Sequence[Point], bad: Keep) -> list[Point]:
    """The newest run of consecutive steps where ``bad`` holds (empty when the newest step is fine)."""
    start = len(pts)
    while start > 0 and bad(pts[start - 1][1]):
        start -= 1
    return list(pts[start:])


__all__ = ["Point", "Trajectory", "line_fit", "mean", "not_nan", "persisting", "rel_slope", "residual_std", "tail",
           "trailing"]
