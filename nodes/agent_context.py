"""Builds the ``AgentContext`` both agents see, from graph state and the ledger."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mart.nodes import stages
from mart.nodes.agents.base import AgentContext
from mart.nodes.agents.job_model import JobModel, Observation, observation_from_records
from mart.nodes.agents.memory_model import MemoryModel
from mart.nodes.agents.schedule import diagnose
from mart.nodes.stages import StageView
from mart.nodes.stages.schedule import diagnosis_input
from mart.nodes.stages.system import CUT_REASON, EARLY_LOOK_STEP
from mart.state.graph_state import running_trials
from mart.state.metrics import mean_throughput
from mart.state.models import TrialRecord, TrialStatus
from mart.state.objectives import peak_memory_gb, throughput_window
from mart.state.stages import measures_throughput


def build_job_model(state: Mapping[str, Any], services, history: list[TrialRecord]) -> JobModel | None:
    """The job model calibrated on every finished trial (stage 1's, then stage 2's), or None when the
    backend cannot describe its job."""
    job = services.job_description()
    if job is None:
        return None
    stage = state["stage"]
    system = stages.get("system")
    model = JobModel(job, system.base_config(StageView(state, services)))
    preds = services.ledger.predictions(services.run_id)
    window = throughput_window(system.horizon(services.options))
    obs = []
    for t in history:
        if not measures_throughput(t.stage) and measures_throughput(stage):
            continue
        p = preds.get(t.candidate_id or "", {})
        records = services.ledger.metric_records(t.trial_id)
        throughput_trial = measures_throughput(t.stage)
        if throughput_trial and (t.reason or "").startswith(CUT_REASON):
            # cut at its early look: what it measured from the look on, as while it ran
            obs.append(_from_look(t.config, records, EARLY_LOOK_STEP, window[1], peak_gb=t.peak_memory_gb,
                                  predicted_peak_gb=p.get("predicted_memory_gb"),
                                  predicted_throughput=p.get("predicted_throughput")))
            continue
        obs.append(observation_from_records(
            t.config, records, peak_gb=t.peak_memory_gb,
            oom=t.status is TrialStatus.OOM, throughput=t.throughput if throughput_trial else None,
            window=window, predicted_peak_gb=p.get("predicted_memory_gb") if throughput_trial else None,
            predicted_throughput=p.get("predicted_throughput") if throughput_trial else None))
    obs += early_observations(state, services)
    return model.fit(obs)


def _from_look(config: dict[str, Any], records: list, look: int, horizon: int, *, peak_gb: float | None = None,
               predicted_peak_gb: float | None = None, predicted_throughput: float | None = None) -> Observation:
    """A stage-1 trial as measured from its early look's step on: phase times, throughput and peak so far (``peak_gb``
    when the ledger has it already), with what was predicted before it ran."""
    window = (look, horizon)
    thr = mean_throughput(records, *window)
    if peak_gb is None:
        peak = peak_memory_gb(records)
        peak_gb = None if math.isnan(peak) else peak
    return observation_from_records(config, records, peak_gb=peak_gb, oom=False,
                                    throughput=None if math.isnan(thr) else thr, window=window,
                                    predicted_peak_gb=predicted_peak_gb, predicted_throughput=predicted_throughput)


def early_observations(state: Mapping[str, Any], services) -> list[Observation]:
    """Stage-1 trials still running whose early look was taken (``RunningTrial.looked``): what their steps from the
    look on measured, as if they had ended there (their phase times, throughput and peak so far). The trial's
    own ending replaces it once it is collected."""
    out = []
    horizon = stages.get("system").horizon(services.options)
    for rt in running_trials(state, "system"):
        if not rt.looked or rt.look_at is None:
            continue
        out.append(_from_look(rt.record.config, services.ledger.metric_records(rt.record.trial_id), rt.look_at,
                              horizon))
    return out


def build_agent_context(state: Mapping[str, Any], services, slots: int = 1) -> AgentContext:
    """What the agents see at a decision point that fills ``slots`` free trial slots (the trials still in flight
    are ``pending``: never proposed again, and spread away from by a batch)."""
    stage = state["stage"]
    policy = stages.get(stage)
    space = services.backend.search_space()
    history = [TrialRecord.from_row(r) for r in services.ledger.trials() if r.get("status") != "running"]
    pending = [r.record for r in running_trials(state, stage)] + StageView(state, services).queued(stage)
    job_model = build_job_model(state, services, history)
    model = MemoryModel.fit(
        # a memory-bound stage fits on its own trials (full peaks); the others on every trial
        [t for t in history if t.stage == stage] if policy.traits.memory_bound else history,
        [p.key for p in space.params], services.memory_capacity_gb(),
    )
    predict_memory = model.predict
    if job_model is not None:
        def predict_memory(config: dict[str, Any]) -> float | None:
            return job_model.predict(config).peak_gb
    notes: list[str] = []  # the backend's own notes (verl's perf guide) come from prompts.BACKEND_NOTES
    diagnosis = segment = None
    if policy.traits.branches:  # the trajectory at the checkpoint the next segment starts from
        records, events, segment = diagnosis_input(state, services)
        diagnosis = diagnose(records, [e.rule for e in events]) if segment is not None else None
    return AgentContext(
        stage=stage,
        objective=policy.objective,
        search_space=space,
        base_config=policy.base_config(StageView(state, services)),
        best_overrides=dict((state.get("best_overrides") or {}).get(stage, {})),
        profile=(state.get("profiles") or {}).get(stage),
        history=history,
        health_events=services.ledger.health_events(),
        feedback=list(state.get("feedback") or []),
        memory_limit_gb=services.memory_limit_gb(),
        predict_memory=predict_memory,
        # a batch needs more to choose from: enough candidates for each slot (capped, for LLM prompts)
        num_candidates=min(24, services.options.num_candidates * max(1, slots)),
        slots=max(1, slots),
        pending=pending,
        round=state.get("round", 0),
        seed=services.options.seed,
        backend=services.backend.name,
        notes=notes,
        validate_config=services.backend.validate_config,
        rejected=services.ledger.rejected_overrides(services.run_id, stage),
        job_model=job_model,
        predictions=services.ledger.prediction_record(services.run_id, stage),
        diagnosis=diagnosis,
        segment=segment,
        horizon=services.options.schedule_total_steps() if segment is not None else None,
    )
