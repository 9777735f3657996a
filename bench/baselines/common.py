"""Running one trial to its end through a backend, and the records the benchmark keeps of it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mart.state.metrics import StepRecord
from mart.state.objectives import learning_score, system_outcome
from mart.state.trials import TrialSpec
from mart.trial_runner.base import Backend, TrialRunner


@dataclass(frozen=True)
class Budget:
    """Trial counts and horizons shared by every method (mart included)."""

    system_trials: int = 10
    learning_trials: int = 6
    system_horizon: int = 6
    learning_horizon: int = 30
    memory_margin: float = 0.1
    poll_sleep_s: float = 0.0  # between polls (0 for the sim's poll clock; >0 for real workloads)


@dataclass
class TrialOutcome:
    """One trial as the benchmark sees it (every method, mart included, is reduced to a list of these)."""

    stage: str
    seq: int
    overrides: dict[str, Any]
    status: str
    throughput: float | None = None
    peak_memory_gb: float | None = None
    feasible: bool = False
    score: float | None = None
    early_stopped: bool = False
    gpu_hours: float = 0.0
    planned_gpu_hours: float = 0.0
    steps_done: int = 0
    reason: str | None = None
    started_s: float | None = None  # parallel runs: simulated seconds from the session's start
    ended_s: float | None = None
    probe: bool = False
    """a fit probe (a short run that measures memory only: no throughput, never a pick)"""
    trial_id: str | None = None  # mart's ledger id (the other methods number their trials by ``seq``)
    rerun: bool = False
    """a re-run of a config already measured (mart's stage-1 re-measurement of the baseline and its best, or the
    repeat of a disturbed measurement): its GPU-hours count, but it finds no new config, so it is no point of the
    best-so-far curve (``bench.compare.summarize``)"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MethodResult:
    """Everything one method did on one scenario x seed."""

    method: str
    scenario: str
    seed: int
    trials: list[TrialOutcome] = field(default_factory=list)
    best_system: dict[str, Any] = field(default_factory=dict)
    best_learning: dict[str, Any] = field(default_factory=dict)
    best_throughput: float | None = None
    best_score: float | None = None
    wall_s: float = 0.0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["trials"] = [t.to_dict() for t in self.trials]
        return d


def _nan_to_none(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def trial_usage(runner: TrialRunner, handle, wall_s: float, n_devices: int) -> tuple[float, float]:
    """(GPU-hours used, GPU-hours the full trial would have used): the sim's own accounting, else wall time."""
    usage = getattr(runner, "usage", None)
    if usage is not None:
        u = usage(handle)
        if u:
            return float(u["gpu_hours"]), float(u["planned_gpu_hours"])
    return wall_s * n_devices / 3600.0, wall_s * n_devices / 3600.0


def run_trial(
    backend: Backend,
    runner: TrialRunner,
    *,
    trial_id: str,
    stage: str,
    seq: int,
    base: dict[str, Any],
    overrides: dict[str, Any],
    steps: int,
    workdir: Path,
    seed: int,
    limit_gb: float | None,
    poll_sleep_s: float = 0.0,
    on_records: Callable[[list[StepRecord]], bool] | None = None,
    n_devices: int = 1,
    records_out: list[StepRecord] | None = None,
) -> TrialOutcome:
    """Launch, poll until it ends (or ``on_records`` asks to stop it), score it with ``mart.state.objectives``.

    ``on_records(all_records_so_far)`` returning True stops the trial (a pruner). ``records_out``, when
    given, receives the trial's metric records.
    """
    spec = TrialSpec(trial_id=trial_id, config={**base, **overrides}, steps=steps, trial_dir=str(workdir / trial_id),
                     memory_capacity_gb=backend.memory_capacity_gb(), seed=seed, stage=stage)
    t0 = time.monotonic()
    handle = runner.launch(spec)
    tail = runner.metrics(handle)
    records: list[StepRecord] = []
    stopped = False
    while True:
        poll = runner.poll(handle)
        new = tail.read_new()
        if new:
            records.extend(new)
            if on_records is not None and not poll.status.is_finished() and on_records(records):
                poll = runner.stop(handle, reason="pruned by the baseline's pruner")
                records.extend(tail.read_new())
                stopped = poll.status.value == "stopped"
        if poll.status.is_finished():
            records.extend(tail.read_new())
            break
        if poll_sleep_s:
            time.sleep(poll_sleep_s)
    if records_out is not None:
        records_out.extend(records)
    used, planned = trial_usage(runner, handle, time.monotonic() - t0, n_devices)
    out = TrialOutcome(stage=stage, seq=seq, overrides=dict(overrides), status=poll.status.value,
                       early_stopped=stopped, gpu_hours=used, planned_gpu_hours=planned,
                       steps_done=max((r.step for r in records), default=0), reason=poll.reason)
    if stage == "system":
        so = system_outcome(records, steps, limit_gb)
        out.throughput = _nan_to_none(so.throughput)
        out.peak_memory_gb = _nan_to_none(so.peak_memory_gb)
        out.feasible = out.status == "completed" and so.feasible
    else:
        out.score = _nan_to_none(learning_score(records, backend.score_metric_prefix))
        out.feasible = out.status == "completed" and out.score is not None
    return out
