"""The metric vocabulary every layer speaks: one verl-format step record and the reductions over them.

Reading streams from files (tailing, writing) is the trial runners' job: ``mart.trial_runner.metrics``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

THROUGHPUT_KEY = "perf/throughput"
#: the throughput stage 1 compares, when a backend writes one beside verl's wall-clock ``perf/throughput``: the local
#: trainer times its steps on its own CPU time, which a busy machine does not stretch (trial_runner/local/timing.py);
#: ``mart/compared_s/<phase>`` are its phase times on the same clock. Other backends' records compare perf/throughput.
COMPARED_THROUGHPUT_KEY = "mart/compared_throughput"
COMPARED_TIMING_PREFIX = "mart/compared_s/"
#: verl 0.9 renames the actor's memory metrics to actor/perf/...; accept both.
MEMORY_KEYS = ("perf/max_memory_allocated_gb", "actor/perf/max_memory_allocated_gb")
#: the device-wide peak a runner measured with NVML (whole GPU, less what other processes held before launch);
#: when present it is the peak (the torch metrics miss vLLM's KV cache and the other workers).
DEVICE_MEMORY_KEY = "mart/device_peak_memory_gb"


@dataclass
class StepRecord:
    """One ``{"step": N, "data": {...}}`` line; values are floats (NaN for null/unparseable)."""

    step: int
    data: dict[str, float] = field(default_factory=dict)

    def get(self, key: str, default: float = math.nan) -> float:
        return self.data.get(key, default)


def step_throughput(rec: StepRecord) -> float:
    """The throughput a stage compares for this step: the backend's compared figure when it wrote one, else
    ``perf/throughput`` (NaN if neither)."""
    v = rec.data.get(COMPARED_THROUGHPUT_KEY)
    return rec.get(THROUGHPUT_KEY) if v is None or math.isnan(v) else v


def phase_seconds(rec: StepRecord, phase: str) -> float:
    """A phase's time (``step`` for the whole step) on the clock its throughput is compared on: the backend's
    ``mart/compared_s/<phase>`` when it wrote one, else verl's wall-clock ``timing_s/<phase>`` (NaN if neither)."""
    v = rec.data.get(COMPARED_TIMING_PREFIX + phase)
    return rec.get(f"timing_s/{phase}") if v is None or math.isnan(v) else v


def compared_phase_times(rec: StepRecord) -> dict[str, float]:
    """Every ``timing_s/<name>`` the step logged (phases, ``step``, ``testing`` ...), each on its compared clock
    (``phase_seconds``): what a per-phase judgement of a stage-1 measurement reads."""
    n = len("timing_s/")
    return {k[n:]: phase_seconds(rec, k[n:]) for k in rec.data if k.startswith("timing_s/")}


def _to_float(value: Any) -> float | None:
    """A JSON value as a metric: numbers (and bools) as floats, null as NaN, anything else (a string, a list)
    is not a metric (None). verl's console logger prints numbers only, so both routes carry the same keys."""
    if value is None:
        return math.nan
    if isinstance(value, (int, float)):  # bool included
        return float(value)
    return None


def parse_line(line: str) -> StepRecord | None:
    """Parse one JSONL line of verl's file logger, or None if it is not such a record.

    verl writes NaN and +-inf as ``null`` (orjson); they read back as NaN. Non-numeric values are left out.
    """
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or "step" not in obj or not isinstance(obj.get("data"), dict):
        return None
    try:
        step = int(obj["step"])
    except (TypeError, ValueError):
        return None
    data = {str(k): f for k, v in obj["data"].items() if (f := _to_float(v)) is not None}
    return StepRecord(step=step, data=data)


def mean_over_steps(records: list[StepRecord], key: str, first: int, last: int) -> float:
    """Mean of ``key`` over steps first..last inclusive (NaN values skipped; NaN if none)."""
    vals = [r.get(key) for r in records if first <= r.step <= last]
    vals = [v for v in vals if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def mean_throughput(records: list[StepRecord], first: int, last: int) -> float:
    """Mean compared throughput (``step_throughput``) over steps first..last inclusive (NaN if none)."""
    vals = [step_throughput(r) for r in records if first <= r.step <= last]
    vals = [v for v in vals if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def last_value(records: list[StepRecord], key_prefix: str) -> float:
    """Last finite value of the first key starting with ``key_prefix`` (e.g. ``val-core/``)."""
    for rec in reversed(records):
        for k, v in rec.data.items():
            if k.startswith(key_prefix) and not math.isnan(v):
                return v
    return math.nan
