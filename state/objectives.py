"""The two stage objectives, as pure functions of a trial's metric records.

Stage 1 (system): mean ``perf/throughput`` over updates 3-5 (MART's window; fewer steps -> the last ones),
feasible only when the peak memory stays within ``(1 - margin) x capacity``.
Stage 2 (learning): the final validation score (last ``val-core/...`` value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mart.state.metrics import StepRecord, last_value, mean_over_steps

THROUGHPUT_KEY = "perf/throughput"
#: verl 0.9 renames the actor's memory metrics to actor/perf/...; accept both.
MEMORY_KEYS = ("perf/max_memory_allocated_gb", "actor/perf/max_memory_allocated_gb")
THROUGHPUT_WINDOW = (3, 5)


def peak_memory_gb(records: list[StepRecord]) -> float:
    """Largest memory reading over all steps (NaN if the stream has none)."""
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
    return mean_over_steps(records, THROUGHPUT_KEY, first, last)


def memory_limit_gb(capacity_gb: float | None, margin: float) -> float | None:
    return None if capacity_gb is None else (1.0 - margin) * capacity_gb


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
    """Final validation score: the last finite value of a metric under ``prefix``."""
    return last_value(records, prefix)
