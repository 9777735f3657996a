"""Reading verl-format metric streams robustly: complete lines only, null -> NaN, tolerant of junk."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class StepRecord:
    """One ``{"step": N, "data": {...}}`` line; values are floats (NaN for null/unparseable)."""

    step: int
    data: dict[str, float] = field(default_factory=dict)

    def get(self, key: str, default: float = math.nan) -> float:
        return self.data.get(key, default)


def _to_float(value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def parse_line(line: str) -> StepRecord | None:
    """Parse one JSONL line of verl's file logger, or None if it is not such a record."""
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
    return StepRecord(step=step, data={str(k): _to_float(v) for k, v in obj["data"].items()})


class MetricsTail:
    """Incremental reader of a growing JSONL file: returns only ``\\n``-terminated lines, once each.

    Keeps a byte offset, so a half-written last line is read on a later call, when it is complete.
    ``parse`` turns one line into a record (default: verl's file-logger JSON; console logs use another).
    """

    def __init__(self, path: str | os.PathLike, offset: int = 0,
                 parse: Callable[[str], StepRecord | None] | None = None) -> None:
        self.path = Path(path)
        self.offset = offset
        self.parse = parse or parse_line

    def read_new(self) -> list[StepRecord]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        records = []
        for raw in chunk[: end + 1].splitlines():
            rec = self.parse(raw.decode("utf-8", errors="replace"))
            if rec is not None:
                records.append(rec)
        return records


def write_record(f, step: int, data: dict[str, Any]) -> None:
    """Append one verl-format line (NaN/inf -> null) and flush it whole."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}
    f.write(json.dumps({"step": step, "data": clean}) + "\n")
    f.flush()


def mean_over_steps(records: list[StepRecord], key: str, first: int, last: int) -> float:
    """Mean of ``key`` over steps first..last inclusive (NaN values skipped; NaN if none)."""
    vals = [r.get(key) for r in records if first <= r.step <= last]
    vals = [v for v in vals if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def last_value(records: list[StepRecord], key_prefix: str) -> float:
    """Last finite value of the first key starting with ``key_prefix`` (e.g. ``val-core/``)."""
    for rec in reversed(records):
        for k, v in rec.data.items():
            if k.startswith(key_prefix) and not math.isnan(v):
                return v
    return math.nan
