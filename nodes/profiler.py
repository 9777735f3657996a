"""Profiler: builds each stage's phase-wise profile from its baseline trial.

Every stage runs its baseline alone first (``StagePolicy.baseline_plan``); once the trial tools collected it,
stage control sends it here, and the profile (phase shares, throughput, memory headroom, lengths) is what the
agents propose from.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes import stages
from mart.nodes.runtime import Services, services_for
from mart.state.graph_state import TuningState
from mart.state.metrics import StepRecord, last_value, mean_over_steps, mean_throughput
from mart.state.models import PhaseProfile, Profile, TrialRecord
from mart.state.objectives import peak_memory_gb, throughput_window
from mart.state.stages import StageName, measures_throughput

#: verl's phases of one RL step, in execution order.
PHASES = ("gen", "old_log_prob", "ref", "adv", "update_actor")


def build_profile(
    trial: TrialRecord, records: list[StepRecord], horizon: int, memory_limit_gb: float | None,
    score_prefix: str = "val-core/",
) -> Profile:
    """Pure: phase shares, throughput, memory headroom and response lengths of one trial."""
    first, last = throughput_window(horizon)
    if not any(first <= r.step <= last for r in records):
        # a trial that ended early (a stage-1 baseline cut at its look): every step it ran, less step 1 where a
        # later one exists (step 1 carries the warm-up)
        last = max((r.step for r in records), default=1)
        first = 2 if last >= 2 else 1

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
        throughput=trial.throughput if trial.throughput is not None else mean_throughput(records, first, last),
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


def profiler(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["stage_control"]]:
    """Builds the stage's profile from its finished baseline (the stage ran the baseline alone first)."""
    services = services_for(state, runtime)
    stage: StageName = state["stage"]
    policy = stages.get(stage)
    baseline: TrialRecord = (state.get("baseline") or {})[stage]
    records = services.ledger.metric_records(baseline.trial_id)
    profile = build_profile(baseline, records, policy.horizon(services.options), services.memory_limit_gb(),
                            services.backend.score_metric_prefix)
    services.ledger.set_profile(services.run_id, stage, baseline.trial_id, profile)
    update: dict[str, Any] = {"profiles": {**(state.get("profiles") or {}), stage: profile}}
    if baseline.objective(stage) is None and not _can_search_without_baseline(stage, services):
        # A baseline that produced no objective (crash, OOM) leaves nothing to compare against.
        reason = f"baseline trial {baseline.trial_id} ended {baseline.status.value}: {baseline.reason or 'no objective'}"
        update["exhausted"] = {**(state.get("exhausted") or {}), stage: reason}
    # An infeasible baseline (OOM, over the margin) does not end the stage: the job model knows the peak
    # reached at least the capacity and proposes memory-reducing bundles first. The baseline counts against
    # the stage's budget, so the stage decides whether a candidate follows (--system-trials 1: none).
    return Command(goto="stage_control", update=update)


def _can_search_without_baseline(stage: StageName, services) -> bool:
    """A throughput stage (stage 1) can start from an OOM'd or failed baseline when the job model is available."""
    return measures_throughput(stage) and services.job_description() is not None
