"""The two stage objectives, as pure functions of a trial's metric records.

Stage 1 (system): mean ``perf/throughput`` over updates 3-5 (MART's window; fewer steps -> the last ones),
feasible only when the peak memory stays within ``(1 - margin) x capacity``.
Stage 2 (learning): the final validation score (last ``val-core/...`` value after training). A validation
logged at step 0 (verl's ``val_before_train``) scores the untrained model and is never a trial's result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mart.state.metrics import StepRecord, last_value, mean_over_steps

THROUGHPUT_KEY = "perf/throughput"
#: verl 0.9 renames the actor's memory metrics to actor/perf/...; accept both.
MEMORY_KEYS = ("perf/max_memory_allocated_gb", "actor/perf/max_memory_allocated_gb")
#: the device-wide peak a runner measured with NVML (whole GPU, less what other processes held before launch);
#: when present it is the peak (the torch metrics miss vLLM's KV cache and the other workers).
DEVICE_MEMORY_KEY = "mart/device_peak_memory_gb"
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
