"""The two stage objectives, as pure functions of a trial's metric records.

Stage 1 (system): mean compared throughput (``mart.state.metrics.step_throughput``: ``perf/throughput``, or a
backend's own ``mart/compared_throughput`` such as the local trainer's CPU-timed one) over updates 3-5 (MART's
window; fewer steps -> the last ones), feasible only when the peak memory stays within ``(1 - margin) x capacity``.
Stage 2 (learning): the final validation score (last ``val-core/...`` value after training). A validation
logged at step 0 (verl's ``val_before_train``) scores the untrained model and is never a trial's result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

from mart.state.health import UNHEALTHY, rule_names
from mart.state.metrics import (  # noqa: F401 - the metric keys the objectives read, re-exported
    DEVICE_MEMORY_KEY,
    MEMORY_KEYS,
    THROUGHPUT_KEY,
    StepRecord,
    last_value,
    mean_over_steps,
    mean_throughput,
)
from mart.state.trajectory import Trajectory, not_nan, residual_std

THROUGHPUT_WINDOW = (3, 5)


def peak_memory_gb(records: list[StepRecord]) -> float:
    """Largest memory reading over all steps: the device-wide one when measured, else torch's (NaN if none)."""
    device = [r.get(DEVICE_MEMORY_KEY) for r in records if DEVICE_MEMORY_KEY in r.data]
    device = [v for v in device if not math.isnan(v)]
    if device:
        return max(device)
    vals = [r.get(k) for r in records for k in MEMORY_KEYS if k in r.data]
    vals = [v for v in vals if not math.isnan(v)]
    return max(vals) if vals else math.nan


def throughput_window(horizon: int) -> tuple[int, int]:
    """Updates 3-5 when the horizon allows it; else the last (up to) three updates."""
    first, last = THROUGHPUT_WINDOW
    if horizon >= last:
        return first, last
    return max(1, horizon - 2), horizon


def system_throughput(records: list[StepRecord], horizon: int) -> float:
    first, last = throughput_window(horizon)
    return mean_throughput(records, first, last)


def memory_limit_gb(capacity_gb: float | None, margin: float) -> float | None:
    return None if capacity_gb is None else (1.0 - margin) * capacity_gb


#: a predicted peak whose chance of passing the limit is at most this is low-risk (the critic's "risk low")
LOW_RISK_P_OVER = 0.05


def p_over_limit(peak_gb: float, gap_gb: float, limit_gb: float) -> float:
    """The chance a predicted peak passes the limit: the prediction's safety gap read as two standard deviations
    of its error (normal)."""
    sigma = max(gap_gb / 2.0, 1e-6)
    return 0.5 * math.erfc((limit_gb - peak_gb) / (sigma * math.sqrt(2)))


@dataclass
class SystemOutcome:
    throughput: float
    peak_memory_gb: float
    feasible: bool


def system_outcome(records: list[StepRecord], horizon: int, limit_gb: float | None) -> SystemOutcome:
    thr = system_throughput(records, horizon)
    peak = peak_memory_gb(records)
    feasible = not math.isnan(thr) and (limit_gb is None or math.isnan(peak) or peak <= limit_gb)
    return SystemOutcome(thr, peak, feasible)


def learning_score(records: list[StepRecord], prefix: str = "val-core/") -> float:
    """Final validation score: the last finite value under ``prefix`` logged after training (step >= 1).

    NaN when the only validation is the step-0 one (the untrained model) or there is none: the caller marks
    the trial unscored (``unscored_reason``), it never ranks it.
    """
    return last_value([r for r in records if r.step >= 1], prefix)


def unscored_reason(records: list[StepRecord], prefix: str = "val-core/") -> str:
    """Why ``learning_score`` found nothing, in words for the ledger and the summary."""
    if any(k.startswith(prefix) for r in records if r.step < 1 for k in r.data):
        return (f"unscored: the only validation ({prefix}...) is the step-0 one, before training; "
                "it never counts as a result (trainer.test_freq must make verl validate at the last step)")
    return f"unscored: no validation metric ({prefix}...) after training"


# --- stage 2 under noise: the trajectory behind a score -----------------------------------------------
ENTROPY_COLLAPSE_RATIO = 0.15  # as the health monitor's entropy_collapse rule


def validation_series(records: list[StepRecord], prefix: str = "val-core/") -> list[tuple[int, float]]:
    """(step, value) of the first validation metric under ``prefix`` with a value (not NaN) in each record."""
    return Trajectory(records).prefixed(prefix, keep=not_nan)


def _noise_tail(series: list[tuple[int, float]]) -> list[tuple[int, float]] | None:
    """The validation points a noise is measured on: the second half (the early climb is no line), None with
    fewer than 4 there."""
    tail = series[len(series) // 2:]
    return tail if len(tail) >= 4 else None


def validation_noise(series: list[tuple[int, float]]) -> float | None:
    """Measurement noise of one trial's validation score: the residual std around a straight line over the
    second half of its validation points (None with fewer than 4 points there)."""
    tail = _noise_tail(series)
    return None if tail is None else residual_std(tail)


def pooled_validation_noise(serieses: list[list[tuple[int, float]]]) -> float | None:
    """One noise from several trials' validation curves: their residual variances around their lines (the
    second half of each, as ``validation_noise``) pooled by degrees of freedom. The median of the per-curve
    estimates it replaces is biased low when the curves are short: with 2 degrees of freedom the median of
    the std is 0.83 x the true noise."""
    ss, df = 0.0, 0
    for series in serieses:
        tail = _noise_tail(series)
        if tail is not None:
            k = len(tail) - 2  # a line's two parameters
            ss += residual_std(tail) ** 2 * k
            df += k
    return math.sqrt(ss / df) if df else None


FALL_ALPHA = 0.05
"""How often a trajectory whose true score holds flat at its end may show a ``validation fell`` signal by its
measurement noise alone (``fall_tolerance``)."""


def fall_tolerance(noise: float | None, points: int) -> float:
    """How far the last of ``points`` validation scores may sit below their best by noise alone: each earlier
    point minus the last is a difference of two noisy scores (``noise`` x sqrt 2), and the best is the largest of
    ``points - 1`` of them, so the bound is their one-sided ``1 - FALL_ALPHA / (points - 1)`` quantile (Bonferroni).
    Three points: 2.8 x the noise; a 60-step path validated every 5 steps (13 points): 3.7 x. A flat 3 x the noise
    flagged about one such path in five."""
    if not noise or points < 2:
        return 0.0
    return noise * math.sqrt(2) * NormalDist().inv_cdf(1 - FALL_ALPHA / (points - 1))


def collapse_signals(records: list[StepRecord], rules_fired: list[str], noise: float | None,
                     prefix: str = "val-core/") -> list[str]:
    """Why a trajectory looks unhealthy (empty = healthy): health events of the collapse rules, a validation
    score that fell from its best by more than its noise explains (``fall_tolerance``: the best of several noisy
    points sits above the truth, the more so the more points), an entropy below 0.15 x its early level. The collapse rules are the registered
    rules of the unhealthy kinds (``mart.state.health.UNHEALTHY``; their warnings count too: a collapse that had
    not yet persisted long enough to stop the trial is still a collapse signal)."""
    collapse_rules = rule_names(*UNHEALTHY)
    signals = sorted({f"health: {r}" for r in rules_fired if r in collapse_rules})
    series = validation_series(records, prefix)
    if len(series) >= 3:
        best = max(v for _, v in series)
        drop = best - series[-1][1]
        tol = fall_tolerance(noise, len(series))
        if drop > max(tol, 0.01 * max(abs(best), 1e-9)):
            signals.append(f"validation fell {drop:.4g} from its best {best:.4g}")
    ent = [v for _, v in Trajectory(records).series("actor/entropy", keep=not_nan)]
    if len(ent) >= 4:
        early = sum(ent[:2]) / 2
        if early > 0 and ent[-1] < ENTROPY_COLLAPSE_RATIO * early:
            signals.append(f"entropy {ent[-1]:.3g} < {ENTROPY_COLLAPSE_RATIO} x early {early:.3g}")
    return signals


@dataclass
class Contender:
    """One learning config's evidence: its scores over seeds and whether any of its runs looked unhealthy."""

    key: str  # the trial id of its first run
    scores: list[float]
    signals: list[str]
    is_baseline: bool = False
    first_signals: list[str] = field(default_factory=list)  # those of its first run alone
    # inferred from other trials, not from its own runs: RISK_NONE, RISK_BELOW_COLLAPSE or RISK_AT_CLIFF
    risk: int = 0
    risk_why: str = ""
    move: float = 0.0  # how far its config is from the defaults (``move_size``)

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores)

    @property
    def spread(self) -> float | None:
        """Sample std over seeds (None with one run)."""
        if len(self.scores) < 2:
            return None
        m = self.mean
        return math.sqrt(sum((s - m) ** 2 for s in self.scores) / (len(self.scores) - 1))


#: the lead over the defaults, in standard errors of the difference, a change needs to replace them (closer is
#: "too close to call"; stage 3 uses the same for its ties)
Z_LEAD = 2.0


def pick_learning_winner(contenders: list[Contender], noise: float, z: float = Z_LEAD,
                         guard_baseline: bool = False, z_unhealthy: float = 3.0) -> tuple[Contender, list[Contender]]:
    """The winner by mean score, and the contenders too close to it to call (to re-evaluate).

    A contender with a run that ended early (oom, failed, stopped) loses to any contender whose runs all
    finished; one with other collapse signals only wins over healthy ones when its mean beats the best
    healthy mean by more than ``z_unhealthy`` x the noise of a difference; "too close" = within ``z`` x that noise of the winner
    (with fewer seeds, a larger noise). The baseline always counts as a contender. ``guard_baseline`` (the
    final call): a winner that does not beat the baseline by more than ``z`` x the difference noise gives
    way to the baseline -- a change must be shown to help before it replaces the defaults.
    """
    def diff_noise(a: Contender, b: Contender) -> float:
        return noise * math.sqrt(1 / len(a.scores) + 1 / len(b.scores))

    ranked = sorted(contenders, key=lambda c: (-c.mean, not c.is_baseline))
    healthy = [c for c in ranked if not c.signals]
    # a config with a run that did not finish (collapse, oom) never wins while another config finished all
    # of its runs; one with other collapse signals needs a clear lead (z_unhealthy x the difference noise)
    finished = [c for c in ranked if not any(" ended " in s for s in c.signals)] or ranked
    winner = finished[0]
    if winner.signals and healthy:
        h = healthy[0]
        if winner.mean - h.mean <= z_unhealthy * diff_noise(winner, h):
            winner = h
    base = next((c for c in ranked if c.is_baseline), None)
    if guard_baseline and base is not None and winner is not base and not base.signals:
        if winner.mean - base.mean <= z * diff_noise(winner, base):
            winner = base
    close = [c for c in ranked if c is not winner and winner.mean - c.mean <= z * diff_noise(winner, c)]
    return winner, close


# --- stage 2: the final choice under noise ------------------------------------------------------------
# One 30-step score per config cannot tell a real gain from a lucky seed, nor a config that collapses in
# expectation from one whose seed happened not to collapse. The choice below treats the defaults as a
# contender like any other: a change replaces them only when it was re-run on a second seed, its mean beats
# theirs by more than ``z`` standard errors of the difference (with the pooled noise), its re-runs alone
# beat them too (its first run was picked for being high, so it is biased upward), no run of it showed a
# collapse signal, and no trial at a learning rate less than one doubling above its own collapsed (one
# within two doublings needs ``Z_RISKIER``). Among the changes that qualify, a larger move from the defaults
# replaces a smaller one only when it beats it by ``Z_LARGER_MOVE`` standard errors (a riskier one by
# ``Z_RISKIER``): with weak evidence the smaller move wins.

RISK_NONE, RISK_BELOW_COLLAPSE, RISK_AT_CLIFF = 0, 1, 2
#: the lead (in standard errors) a riskier config needs over a safer one: the collapse it may be spared on
#: two seeds costs far more than the noise, so a lead of 2 standard errors does not pay for the risk
Z_RISKIER = 3.0
#: the lead (in standard errors) a larger move needs over a smaller one that already beat the defaults: a
#: near tie goes to the smaller move, a clear lead to the larger (it must beat the defaults on its own too)
Z_LARGER_MOVE = 1.0


def noise_estimate(series: list[tuple[int, float]]) -> tuple[float, int] | None:
    """``validation_noise`` with its degrees of freedom (tail points - 2), for pooling."""
    n = validation_noise(series)
    return None if n is None else (n, len(series[len(series) // 2:]) - 2)


def replicate_noise(scores: list[float]) -> tuple[float, int] | None:
    """Seed-to-seed std of one healthy config's scores, with its degrees of freedom (None with one run)."""
    if len(scores) < 2:
        return None
    m = sum(scores) / len(scores)
    return math.sqrt(sum((s - m) ** 2 for s in scores) / (len(scores) - 1)), len(scores) - 1


def pooled_noise(estimates: list[tuple[float, int]]) -> tuple[float, float] | None:
    """One score noise from several (std, dof) estimates, and its effective degrees of freedom.

    The median of ``s^2 / m_k`` with ``m_k`` the median of chi^2_k / k (Wilson-Hilferty:
    ``(1 - 2/(9k))^3``), so each term is a median-unbiased estimate of the variance: a plain median of 2-dof
    stds sits ~17% low (the median of chi^2_2 / 2 is ln 2), which made noisy leads look real; the median keeps
    one wild estimate (a collapse no monitor saw) out. Its dof: 2/pi of the total (the median's efficiency).
    """
    kept = [(s * s / (1 - 2 / (9 * k)) ** 3, k) for s, k in estimates if k >= 1 and math.isfinite(s)]
    if not kept:
        return None
    terms = sorted(v for v, _ in kept)
    mid = len(terms) // 2
    var = terms[mid] if len(terms) % 2 else (terms[mid - 1] + terms[mid]) / 2
    return math.sqrt(var), 2 / math.pi * sum(k for _, k in kept)


def student_z(z: float, dof: float | None) -> float:
    """The Student-t quantile with ``dof`` degrees of freedom at the normal quantile ``z``'s level
    (Cornish-Fisher expansion): a noise estimated from few points must be met by a larger multiple of it."""
    if dof is None or dof <= 0 or math.isinf(dof):
        return z
    dof = max(dof, 1.0)
    return z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)


def move_size(overrides: dict, base: dict) -> float:
    """How far a config moves from the defaults: per changed knob, |log2| of the ratio for positive numbers
    (at least 1: lr x2 = 1, x4 = 2), else 1. Sums over knobs, so a change of many knobs is a large move."""
    total = 0.0
    for key, new in overrides.items():
        old = base.get(key)
        if old == new:
            continue
        if (isinstance(new, (int, float)) and isinstance(old, (int, float)) and not isinstance(new, bool)
                and not isinstance(old, bool) and new > 0 and old > 0):
            total += max(1.0, abs(math.log2(new / old)))
        else:
            total += 1.0
    return total


def ended_early(c: Contender) -> bool:
    """A run of it did not finish (stopped by the health monitor, oom, failed)."""
    return any(" ended " in s for s in c.signals)


def _can_replace_defaults(c: Contender, base: Contender) -> bool:
    return (not c.is_baseline and not ended_early(c) and c.risk < RISK_AT_CLIFF
            and not (c.signals and not base.signals))


def _beats(c: Contender, w: Contender, noise: float, z: float, dof: float | None) -> bool:
    """c's mean beats w's by more than z standard errors of the difference, and c's re-runs alone beat w."""
    se = noise * math.sqrt(1 / len(c.scores) + 1 / len(w.scores))
    if c.risk > w.risk:
        z = max(z, Z_RISKIER)
    z = student_z(z, dof)
    reruns = c.scores[1:]
    return c.mean - w.mean > z * se and bool(reruns) and sum(reruns) / len(reruns) > w.mean


def _no_defaults_pool(contenders: list[Contender]) -> list[Contender]:
    finished = [c for c in contenders if not ended_early(c)] or contenders
    safe = [c for c in finished if c.risk < RISK_AT_CLIFF] or finished
    return [c for c in safe if not c.signals] or safe


def learning_choice(contenders: list[Contender], noise: float, z: float = Z_LEAD,
                    dof: float | None = None) -> tuple[Contender, str]:
    """The final stage-2 winner and why (see the block comment above). Without a measured baseline (the
    defaults' run failed or collapsed), the best mean among the safest contenders, re-run ones first."""
    base = next((c for c in contenders if c.is_baseline), None)
    if base is None:
        pool = _no_defaults_pool(contenders)
        confirmed = [c for c in pool if len(c.scores) >= 2] or pool
        winner = max(confirmed, key=lambda c: (c.mean, c.key))
        return winner, f"no measured defaults: the best mean over {len(winner.scores)} run(s) of the safest configs"
    eligible = [c for c in contenders if _can_replace_defaults(c, base) and len(c.scores) >= 2]
    winner, why = base, "no change beat the defaults by more than the noise on two seeds"
    for c in sorted(eligible, key=lambda c: (c.risk, c.move, -c.mean, c.key)):
        if not _beats(c, base, noise, z, dof):
            continue
        if winner is base or _beats(c, winner, noise, Z_LARGER_MOVE, dof):
            what = "the defaults" if winner is base else f"{winner.key} (a smaller or safer move)"
            # the verdict's numbers, as a kept baseline's (``baseline_verdict``) gives them: lead, bar, SE, rule
            bar, zt, se = _bar(c, winner, noise, z if winner is base else Z_LARGER_MOVE, dof)
            why = (f"{c.key} beats {what} by {c.mean - winner.mean:.4g} over {len(c.scores)} vs "
                   f"{len(winner.scores)} runs (mean {c.mean:.4f} vs {winner.mean:.4f}), above the bar {bar:.4f} = "
                   f"{zt:.3g} x the standard error of the difference {se:.3g} (noise {noise:.3g}; rule: "
                   f"{EVIDENCE_RULE})")
            winner = c
    return winner, why


#: stage 2's evidence rule in words (stage 3 picks its schedule by the same rule, the static schedule as baseline)
EVIDENCE_RULE = ("a change replaces the baseline only when it ran on two seeds, its mean beats the baseline's by more "
                 "than 2 standard errors of the difference (3 near a collapse), its re-run alone beats the baseline "
                 "too, and no run of it showed a collapse signal")


def _bar(c: Contender, w: Contender, noise: float, z: float, dof: float | None) -> tuple[float, float, float]:
    """The lead c needs over w (``_beats``' threshold), with its z (after the Student widening) and standard error."""
    se = noise * math.sqrt(1 / len(c.scores) + 1 / len(w.scores))
    zt = student_z(max(z, Z_RISKIER) if c.risk > w.risk else z, dof)
    return zt * se, zt, se


def baseline_verdict(contenders: list[Contender], noise: float, z: float = 2.0, dof: float | None = None,
                     baseline: str = "the baseline") -> str | None:
    """Why no change replaced the baseline, in numbers: the change that led it, its lead, the bar it had to clear,
    and what else held it back (None without a measured baseline)."""
    base = next((c for c in contenders if c.is_baseline), None)
    if base is None:
        return None
    rivals = sorted((c for c in contenders if not c.is_baseline and c.mean > base.mean), key=lambda c: (-c.mean, c.key))
    if not rivals:
        return f"no change scored above {baseline}'s {base.mean:.4f}"
    two = [c for c in rivals if len(c.scores) >= 2]
    if not two:
        c = rivals[0]
        return (f"the best change, {c.key}, scored {c.mean - base.mean:+.4f} above {baseline} on one run and was "
                f"not re-run: one run is no evidence (rule: {EVIDENCE_RULE})")
    c = two[0]
    lead = c.mean - base.mean
    bar, zt, se = _bar(c, base, noise, z, dof)
    seeds = "on both seeds" if len(c.scores) == 2 and min(c.scores) > base.mean else f"over {len(c.scores)} runs"
    held = []
    if lead <= bar:
        zbase = max(z, Z_RISKIER) if c.risk > base.risk else z
        held.append(f"the lead is below the bar {bar:.4f} = {zt:.3g} x the standard error of the difference {se:.3g} "
                    f"(the rule's {zbase:g}" + (" near a collapse" if c.risk > base.risk else "")
                    + (", widened for a noise measured from few points" if zt > zbase + 1e-9 else "")
                    + f"; noise {noise:.3g})")
    if ended_early(c):
        held.append("a run of it did not finish")
    if c.risk >= RISK_AT_CLIFF:
        held.append(f"it sits at a collapse's edge ({c.risk_why})")
    if c.signals and not base.signals and not ended_early(c):
        held.append("collapse signals: " + "; ".join(c.signals))
    if c.scores[1:] and sum(c.scores[1:]) / len(c.scores[1:]) <= base.mean:
        held.append("its re-run alone did not beat the baseline")
    return (f"{c.key} led {baseline} {seeds} by {lead:+.4f} (mean {c.mean:.4f} vs {base.mean:.4f}), but "
            + ("; ".join(held) or "a smaller or safer move won") + f" (rule: {EVIDENCE_RULE})")


def next_reevaluation(contenders: list[Contender], noise: float, rerun: set[str], z: float = 2.0,
                      dof: float | None = None) -> Contender | None:
    """The config to re-run on the second seed next, or None when no re-run can change the choice.

    The defaults are re-measured as soon as a re-run change leads them (their one score may be unlucky low);
    otherwise the single-run change nearest to replacing the current choice is re-run (lead over it divided
    by the lead it needs: ``Z_RISKIER`` for a riskier config). A config
    is re-run at most once (``rerun``: the keys already re-run); the caller counts these trials in the
    ``learning_confirm_trials`` budget.
    """
    base = next((c for c in contenders if c.is_baseline), None)
    current, _ = learning_choice(contenders, noise, z, dof)
    if base is not None and base.key not in rerun and len(base.scores) == 1:
        if any(_can_replace_defaults(c, base) and len(c.scores) >= 2 and c.mean > base.mean for c in contenders):
            return base
    if base is None:  # no defaults to beat: confirm the best single runs, while one could top the best re-run
        pool = _no_defaults_pool(contenders)
        confirmed = [c.mean for c in pool if len(c.scores) >= 2]
        hopeful = [c for c in pool if c.key not in rerun and len(c.scores) == 1
                   and (not confirmed or c.mean > max(confirmed))]
        return max(hopeful, key=lambda c: (c.mean, c.key), default=None)
    hopeful = [c for c in contenders if c.key not in rerun and len(c.scores) == 1 and c.mean > current.mean
               and _can_replace_defaults(c, base)]

    # the one nearest to winning: its lead over the current choice in units of the lead it would need (a
    # riskier config needs Z_RISKIER), so a re-run is not spent on a high but risky score a safer one can match
    def promise(c: Contender) -> tuple[float, float, str]:
        need = max(z, Z_RISKIER) if c.risk > current.risk else z
        return (c.mean - current.mean) / need, c.mean, c.key

    return max(hopeful, key=promise, default=None)
