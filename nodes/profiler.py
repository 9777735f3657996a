"""Profiler: runs each stage's baseline and builds its phase-wise profile.

The node runs twice per stage: first it queues the baseline trial (run by the trial tool nodes),
then, once that trial is collected, it reads its metrics from the ledger and builds the ``Profile``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.runtime import Services, services_for
from mart.nodes.stage_control import stage_base_config, stage_horizon
from mart.state.graph_state import TuningState
from mart.state.metrics import StepRecord, last_value, mean_over_steps
from mart.state.models import PhaseProfile, Profile, Stage, TrialRecord
from mart.state.objectives import peak_memory_gb, throughput_window

#: verl's phases of one RL step, in execution order.
PHASES = ("gen", "old_log_prob", "ref", "adv", "update_actor")


def build_profile(
    trial: TrialRecord, records: list[StepRecord], horizon: int, memory_limit_gb: float | None,
    score_prefix: str = "val-core/",
) -> Profile:
    """Pure: phase shares, throughput, memory headroom and response lengths of one trial."""
    first, last = throughput_window(horizon)
    if not any(first <= r.step <= last for r in records):
        first, last = 1, max((r.step for r in records), default=1)

    def mean(key: str) -> float:
        return mean_over_steps(records, key, first, last)

    step_time = mean("timing_s/step")
    phase_times = {p: mean(f"timing_s/{p}") for p in PHASES}
    phase_times = {p: t for p, t in phase_times.items() if not math.isnan(t)}
    total = step_time if step_time and not math.isnan(step_time) else sum(phase_times.values()) or 1.0
    phases = [PhaseProfile(name=p, mean_s=t, share=t / total) for p, t in phase_times.items()]
    bottleneck = max(phases, key=lambda p: p.mean_s).name if phases else "unknown"
    peak = peak_memory_gb(records)
    peak = 0.0 if math.isnan(peak) else peak
    score = last_value(records, score_prefix)
    entropy = mean("actor/entropy")
    return Profile(
        trial_id=trial.trial_id,
        stage=trial.stage,
        throughput=trial.throughput if trial.throughput is not None else mean("perf/throughput"),
        step_time_s=0.0 if math.isnan(step_time) else step_time,
        phases=phases,
        bottleneck=bottleneck,
        peak_memory_gb=peak,
        memory_limit_gb=memory_limit_gb,
        memory_headroom_gb=None if memory_limit_gb is None else memory_limit_gb - peak,
        response_length_mean=_or0(mean("response_length/mean")),
        response_length_max=_or0(max((r.get("response_length/max") for r in records), default=0.0)),
        response_clip_ratio=_or0(mean("response_length/clip_ratio")),
        score=None if math.isnan(score) else score,
        entropy=None if math.isnan(entropy) else entropy,
    )


def _or0(v: float) -> float:
    return 0.0 if v is None or math.isnan(v) else float(v)


def profiler(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["launch_trial", "proposer", "stage_control"]]:
    services = services_for(state, runtime)
    stage: Stage = state["stage"]
    if stage in (state.get("profiles") or {}):
        return Command(goto="proposer")
    baseline: TrialRecord | None = (state.get("baseline") or {}).get(stage)
    if baseline is None:
        # Queue the stage's baseline: the base config as it is (stage 2: stage 1's best system config).
        seq = state.get("trial_seq", 0) + 1
        record = TrialRecord(
            trial_id=f"{stage[:3]}-{seq:02d}-baseline", stage=stage, kind="baseline",
            config=stage_base_config(state, services, stage),
        )
        return Command(goto="launch_trial", update={"pending_trial": record})
    records = services.ledger.metric_records(baseline.trial_id)
    profile = build_profile(baseline, records, stage_horizon(services.options, stage), services.memory_limit_gb(),
                            services.backend.score_metric_prefix)
    services.ledger.set_profile(services.run_id, stage, baseline.trial_id, profile)
    update: dict[str, Any] = {"profiles": {**(state.get("profiles") or {}), stage: profile}}
    if baseline.objective(stage) is None and not _can_search_without_baseline(stage, services):
        # A baseline that produced no objective (crash, OOM) leaves nothing to compare against.
        reason = f"baseline trial {baseline.trial_id} ended {baseline.status.value}: {baseline.reason or 'no objective'}"
        update["exhausted"] = {**(state.get("exhausted") or {}), stage: reason}
        return Command(goto="stage_control", update=update)
    # An infeasible baseline (OOM, over the margin) does not end the stage: the job model knows the peak
    # reached at least the capacity and proposes memory-reducing bundles first. The baseline counts against
    # the stage's budget, so stage control decides whether a candidate follows (--system-trials 1: none).
    return Command(goto="stage_control", update=update)


def _can_search_without_baseline(stage: Stage, services) -> bool:
    """Stage 1 can start from an OOM'd or failed baseline when the job model is available."""
    return stage == "system" and services.job_description() is not None
