"""How sure a decision is: intervals for a gain measured under noise.

One home for the statistics every stage's verdict uses, so that stage 1 (throughput), stage 2 (score) and
stage 3 (a schedule against the static path) state their gains the same way: a point estimate, an interval
at a stated level, the number of measurements behind each side and the method. A change is taken only when
its interval excludes zero; "keep the baseline" and "not enough evidence" are valid answers (the rule of
verl's own communication autotuner, which changes a setting only when a bootstrap interval of the gain
excludes zero).

Throughput gains are ratios, so they are taken on the log scale (a Welch t interval of the difference of mean
log throughputs, back-transformed): noise on a busy machine is multiplicative, and the interval of a ratio is
then symmetric in log space. Scores are compared as differences. scipy supplies the t quantiles; nothing here is
hand-rolled beyond the bookkeeping. No bootstrap: a re-measurement round gives too few measurements for one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as _st

#: The default two-sided level of every interval mart reports (a 90% interval: a one-sided 95% test of "better").
LEVEL = 0.9

Method = Literal["welch-t-log", "paired-t-log", "paired-re-t-log", "welch-t", "paired-t", "known-noise-t", "none"]


@dataclass(frozen=True)
class Interval:
    """A gain with its interval. ``relative``: ``estimate``/``lo``/``hi`` are percent gains over the baseline;
    otherwise they are differences in the measured unit (a score). ``lo``/``hi`` are None when the data cannot
    give an interval (one measurement a side and no other estimate of the spread)."""

    estimate: float
    lo: float | None
    hi: float | None
    n_baseline: int
    n_candidate: int
    level: float
    method: Method
    relative: bool

    @property
    def known(self) -> bool:
        return self.lo is not None and self.hi is not None

    @property
    def confirms_gain(self) -> bool:
        """The candidate is better and the interval says so (its lower end above zero)."""
        return self.lo is not None and self.lo > 0

    @property
    def confirms_loss(self) -> bool:
        return self.hi is not None and self.hi < 0

    @property
    def excludes_zero(self) -> bool:
        return self.confirms_gain or self.confirms_loss

    def covers(self, value: float) -> bool:
        return self.lo is not None and self.hi is not None and self.lo <= value <= self.hi

    def describe(self) -> str:
        """``+12.3% (90% CI +4.1..+20.9%, 3 vs 3 measurements, welch-t-log)``; the unit follows ``relative``."""
        unit = "%" if self.relative else ""
        head = f"{self.estimate:+.{1 if self.relative else 4}f}{unit}"
        if not self.known:
            return f"{head} (no interval: {self.n_baseline} vs {self.n_candidate} measurement(s))"
        d = 1 if self.relative else 4
        return (f"{head} ({self.level:.0%} CI {self.lo:+.{d}f}..{self.hi:+.{d}f}{unit}, "
                f"{self.n_baseline} vs {self.n_candidate} measurements, {self.method})")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Interval:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def _clean(xs: Sequence[float], positive: bool) -> np.ndarray:
    a = np.asarray([float(x) for x in xs if x is not None and math.isfinite(float(x))], dtype=float)
    if positive and (a <= 0).any():
        raise ValueError("throughputs must be positive to compare on the log scale")
    return a


def _welch(b: np.ndarray, c: np.ndarray, level: float) -> tuple[float, float | None, float | None]:
    """Mean difference c - b with a Welch t interval. With one measurement on a side, that side borrows the
    other side's variance (the same machine, the same noise); with one on both, there is no interval."""
    d = float(c.mean() - b.mean())
    if len(b) < 2 and len(c) < 2:
        return d, None, None
    vb = float(b.var(ddof=1)) if len(b) >= 2 else float(c.var(ddof=1))
    vc = float(c.var(ddof=1)) if len(c) >= 2 else vb
    se2 = vb / len(b) + vc / len(c)
    if se2 <= 0:
        return d, d, d
    # Welch-Satterthwaite degrees of freedom; a side with one measurement contributes the other's df
    db, dc = max(len(b) - 1, 1), max(len(c) - 1, 1)
    df = se2**2 / ((vb / len(b)) ** 2 / db + (vc / len(c)) ** 2 / dc)
    half = float(_st.t.ppf(0.5 + level / 2, df)) * math.sqrt(se2)
    return d, d - half, d + half


def _paired(diffs: np.ndarray, level: float) -> tuple[float, float | None, float | None]:
    d = float(diffs.mean())
    if len(diffs) < 2:
        return d, None, None
    se = float(diffs.std(ddof=1)) / math.sqrt(len(diffs))
    half = float(_st.t.ppf(0.5 + level / 2, len(diffs) - 1)) * se
    return d, d - half, d + half


def _pct(log_ratio: float | None) -> float | None:
    return None if log_ratio is None else 100.0 * math.expm1(log_ratio)


def gain_interval(baseline: Sequence[float], candidate: Sequence[float], *, level: float = LEVEL,
                  paired: bool = False) -> Interval:
    """The candidate's throughput gain over the baseline in percent, with a t interval on the log scale.

    ``paired``: the i-th measurements of the two were taken back to back (interleaved), so drift of the
    machine hits both; the interval is then on the per-pair log ratios, which cancels that drift.
    """
    b, c = _clean(baseline, True), _clean(candidate, True)
    if not len(b) or not len(c):
        raise ValueError("a gain needs at least one measurement on each side")
    if paired:
        n = min(len(b), len(c))
        est, lo, hi = _paired(np.log(c[:n]) - np.log(b[:n]), level)
        method: Method = "paired-t-log"
    else:
        est, lo, hi = _welch(np.log(b), np.log(c), level)
        method = "welch-t-log"
    return Interval(_pct(est) or 0.0, _pct(lo), _pct(hi), len(b), len(c), level,
                    method if lo is not None else "none", True)


def rounds_gain_interval(rounds: Sequence[tuple[Sequence[float], Sequence[float]]], *,
                         level: float = LEVEL) -> Interval:
    """The candidate's throughput gain over the baseline from re-measurement rounds, each the aligned throughputs
    (the i-th of each: the same step) of one baseline trial and one candidate trial run back to back.

    Two noises move a round's gain: the steps of a trial (the step pairs' spread within the round) and the trials
    themselves. On a shared machine the same config's trials differ by more than their steps do (where the
    scheduler put them, a neighbour's load), and a round's two trials do not share that part, so pairing does
    not cancel it. One round's pairs cannot see it (its interval is the paired t); over several rounds this is a
    random-effects interval on the log scale, each round's mean gain one estimate: the between-round variance
    beyond the step noise by the method of moments (DerSimonian-Laird), the rounds weighted by it, and the interval
    of Hartung and Knapp with its modification for few estimates (the variance never below the weighted one, t
    with rounds - 1 degrees of freedom; Roever, Knapp & Friede 2015, BMC Med Res Methodol 15:99): two rounds that
    happen to agree say little about how far the next would fall, and the plain random-effects interval then
    claims far more than the machine gives."""
    diffs = []
    for baseline, candidate in rounds:
        b, c = _clean(baseline, True), _clean(candidate, True)
        n = min(len(b), len(c))
        if n:
            diffs.append(np.log(c[:n]) - np.log(b[:n]))
    if not diffs:
        raise ValueError("a gain needs at least one pair of measurements")
    n_pairs = sum(len(d) for d in diffs)
    if len(diffs) == 1:
        est, lo, hi = _paired(diffs[0], level)
        return Interval(_pct(est) or 0.0, _pct(lo), _pct(hi), n_pairs, n_pairs, level,
                        "paired-t-log" if lo is not None else "none", True)
    k = len(diffs)
    means = np.array([d.mean() for d in diffs])
    sizes = np.array([len(d) for d in diffs], dtype=float)
    df_steps = n_pairs - k
    # the step pairs' variance, pooled within rounds (none when every round has one pair: then the rounds' spread
    # is all there is)
    step_var = sum(float(((d - d.mean()) ** 2).sum()) for d in diffs) / df_steps if df_steps >= 1 else 0.0
    between = max(0.0, float(means.var(ddof=1)) - step_var * float(np.mean(1 / sizes)))
    var_r = between + step_var / sizes
    if not (var_r > 0).all():
        est = float(means.mean())
        return Interval(_pct(est) or 0.0, _pct(est), _pct(est), n_pairs, n_pairs, level, "paired-re-t-log", True)
    w = 1 / var_r
    est = float((w * means).sum() / w.sum())
    q = float((w * (means - est) ** 2).sum()) / (k - 1)
    half = float(_st.t.ppf(0.5 + level / 2, k - 1)) * math.sqrt(max(1.0, q) / float(w.sum()))
    return Interval(_pct(est) or 0.0, _pct(est - half), _pct(est + half), n_pairs, n_pairs, level,
                    "paired-re-t-log", True)


def difference_interval(baseline: Sequence[float], candidate: Sequence[float], *, level: float = LEVEL,
                        paired: bool = False) -> Interval:
    """The candidate's score minus the baseline's, with a (Welch or paired) t interval."""
    b, c = _clean(baseline, False), _clean(candidate, False)
    if not len(b) or not len(c):
        raise ValueError("a difference needs at least one measurement on each side")
    if paired:
        n = min(len(b), len(c))
        est, lo, hi = _paired(c[:n] - b[:n], level)
        method: Method = "paired-t"
    else:
        est, lo, hi = _welch(b, c, level)
        method = "welch-t"
    return Interval(est, lo, hi, len(b), len(c), level, method if lo is not None else "none", False)


def relative_spread(samples: Sequence[float]) -> float | None:
    """The coefficient of variation of a set of measurements (None below two): a trial's own noise."""
    a = _clean(samples, False)
    if len(a) < 2 or a.mean() == 0:
        return None
    return float(a.std(ddof=1) / abs(a.mean()))


def noise_difference_interval(baseline: Sequence[float], candidate: Sequence[float], noise: float, *,
                              dof: float | None = None, level: float = LEVEL) -> Interval:
    """The candidate's score minus the baseline's, with a t interval whose spread is a measurement noise known
    from elsewhere (``noise``: the std of one measurement, e.g. the residual noise of many validation points;
    ``dof``: its degrees of freedom, None = many) rather than from the few scores themselves: two runs a side
    say almost nothing of their own spread, while the trajectories behind them measured it many times (stage 3),
    or stage 2's pooled noise of the validation series for configs run on one seed each."""
    b, c = _clean(baseline, False), _clean(candidate, False)
    if not len(b) or not len(c):
        raise ValueError("a difference needs at least one measurement on each side")
    est = float(c.mean() - b.mean())
    if not math.isfinite(noise) or noise <= 0:
        return Interval(est, None, None, len(b), len(c), level, "none", False)
    half = float(_st.t.ppf(0.5 + level / 2, dof if dof and dof > 0 else math.inf)) * noise * math.sqrt(
        1 / len(b) + 1 / len(c))
    return Interval(est, est - half, est + half, len(b), len(c), level, "known-noise-t", False)

