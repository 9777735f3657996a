"""Stage control: session start, budgets, the stage-1 → stage-2 hand-over, and the final summary."""

from __future__ import annotations

import math
import time
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.runtime import Services, ensure_run, services_for
from mart.state.graph_state import TuningState
from mart.state.models import Stage, TrialRecord

STAGES: tuple[Stage, ...] = ("system", "learning")


def stage_budget(options, stage: Stage) -> int:
    return options.system_trials if stage == "system" else options.learning_trials


def stage_horizon(options, stage: Stage) -> int:
    return options.system_horizon if stage == "system" else options.learning_horizon


def stage_base_config(state: dict[str, Any], services, stage: Stage) -> dict[str, Any]:
    """The full config candidates of ``stage`` apply to: stage 2 fixes stage 1's best system overrides."""
    base = dict(services.backend.base_config())
    if stage == "learning":
        base.update((state.get("best_overrides") or {}).get("system", {}))
    return base


def overrides_of(state: dict[str, Any], services, record: TrialRecord) -> dict[str, Any]:
    """The knobs a trial changes relative to its stage's base config."""
    base = stage_base_config(state, services, record.stage)
    return {k: v for k, v in record.config.items() if base.get(k, object()) != v}


def start_session(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["profiler"]]:
    """Initialise counters on the first step (a no-op when resuming a started session).

    A session started from options only (LangGraph Studio) gets its run directory here.
    """
    if state.get("stage"):
        return Command(goto="profiler")
    ids = ensure_run(state)
    services = services_for({**state, **ids}, runtime)
    services.ledger.upsert_run(services.run_id, status="running", options=services.options.model_dump(mode="json"))
    return Command(
        goto="profiler",
        update={
            **ids,
            "stage": "system", "status": "running", "started_at": time.time(), "trial_seq": 0,
            "trials_done": {}, "profiles": {}, "baseline": {}, "best": {}, "best_overrides": {},
            "feedback": [], "round": 0, "reviews": 0, "exhausted": {}, "candidates": [], "critiques": [],
            "selected": None, "pending_trial": None, "active": None, "stop_reason": None,
        },
    )


def out_of_time(state, options) -> bool:
    return bool(options.wall_clock_s) and time.time() - state.get("started_at", time.time()) > options.wall_clock_s


def stage_control(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["proposer", "profiler", "finish"]]:
    """After each finished trial (or a stage that gave up): continue, switch stage, or finish."""
    services = services_for(state, runtime)
    options = services.options
    stage: Stage = state["stage"]
    done = (state.get("trials_done") or {}).get(stage, 0)
    exhausted = (state.get("exhausted") or {}).get(stage)
    if out_of_time(state, options):
        exhausted = exhausted or "wall-clock budget spent"
    if done < stage_budget(options, stage) and not exhausted:
        return Command(goto="proposer", update={"round": 0})
    record_stage_result(state, services, stage, note=exhausted)
    if exhausted and out_of_time(state, options):
        return Command(goto="finish")
    if stage == "system" and options.learning_trials > 0:
        if (state.get("baseline") or {}).get("system") is not None and not (state.get("best") or {}).get("system"):
            # no system config completed within the memory margin: stage 2 would only rerun a failing one
            return Command(goto="finish", update={"exhausted": {
                **(state.get("exhausted") or {}),
                "learning": "skipped: stage 1 found no feasible system config (see the system notes)"}})
        return Command(
            goto="profiler",
            update={"stage": "learning", "round": 0, "feedback": [], "candidates": [], "critiques": [],
                    "selected": None},
        )
    return Command(goto="finish")


def record_stage_result(state, services, stage: Stage, note: str | None = None) -> None:
    base: TrialRecord | None = (state.get("baseline") or {}).get(stage)
    best: TrialRecord | None = (state.get("best") or {}).get(stage)
    if base is None:
        return
    services.ledger.set_stage_result(
        services.run_id, stage, baseline_trial=base.trial_id, best_trial=best.trial_id if best else None,
        baseline_value=base.objective(stage), best_value=best.objective(stage) if best else None,
        best_config=(state.get("best_overrides") or {}).get(stage, {}), note=note or "",
    )


def finish(state: TuningState, runtime: Runtime[Services]) -> dict[str, Any]:
    services = services_for(state, runtime)
    summary = build_summary(state, services)
    services.ledger.upsert_run(services.run_id, status="completed", summary=summary)
    return {"status": "completed", "summary": summary}


def _fmt_gb(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f} GB"


def _clean(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, 6)


def build_summary(state, services) -> dict[str, Any]:
    """The session's result in the documented JSON shape (plus ``notes`` and agent usage)."""
    baseline = state.get("baseline") or {}
    best = state.get("best") or {}
    best_overrides = state.get("best_overrides") or {}
    exhausted = state.get("exhausted") or {}
    sys_base, sys_best = baseline.get("system"), best.get("system")
    learn_base, learn_best = baseline.get("learning"), best.get("learning")
    b_thr = sys_base.throughput if sys_base else None
    t_thr = sys_best.throughput if sys_best else None
    gain = (t_thr / b_thr - 1) * 100 if b_thr and t_thr else None
    b_score = learn_base.score if learn_base else None
    t_score = learn_best.score if learn_best else None
    trials = services.ledger.trials()
    notes = []
    objective = {"system": "throughput", "learning": "score"}
    for stage, base_rec, best_rec in (("system", sys_base, sys_best), ("learning", learn_base, learn_best)):
        if base_rec is not None and base_rec.status.value != "completed":
            notes.append(f"{stage} stage: the baseline {base_rec.status.value} ({base_rec.reason or 'no reason'}); "
                         f"it has no {objective[stage]} and is never reported as one")
        elif base_rec is not None and base_rec.reason and base_rec.objective(stage) is None:
            notes.append(f"{stage} stage: the baseline is {base_rec.reason}")
        elif stage == "system" and base_rec is not None and base_rec.reason == "peak memory above the margin":
            notes.append(f"system stage: the baseline's peak memory ({_fmt_gb(base_rec.peak_memory_gb)}) is above "
                         f"the margin limit ({_fmt_gb(services.memory_limit_gb())}): it is not a feasible config")
        if base_rec is not None and best_rec is None:
            notes.append(f"{stage} stage: no feasible config - every trial failed, ran out of memory, was stopped "
                         f"or exceeded the memory margin; nothing is recommended for this stage")
        elif base_rec is not None and best_rec is not None and best_rec.trial_id == base_rec.trial_id:
            notes.append(f"{stage} stage: no candidate beat the baseline; the baseline config is kept")
        if exhausted.get(stage):
            notes.append(f"{stage} stage ended early: {exhausted[stage]}")
    if services.memory_limit_gb() is None:
        notes.append("memory margin rule off: no memory capacity is known (no GPU visible to the tuner, e.g. trials "
                     "on a Ray cluster); give --memory-capacity-gb to enforce it")
    return {
        "run_id": services.run_id,
        "status": "completed",
        "system": {
            "baseline_throughput": _clean(b_thr),
            "best_throughput": _clean(t_thr),
            "throughput_gain_pct": _clean(gain),
            "best_config": best_overrides.get("system", {}),
            "memory_limit_gb": _clean(services.memory_limit_gb()),
            "best_peak_memory_gb": _clean(sys_best.peak_memory_gb if sys_best else None),
        },
        "learning": {
            "baseline_score": _clean(b_score),
            "best_score": _clean(t_score),
            "score_gain": _clean(t_score - b_score) if t_score is not None and b_score is not None else None,
            "best_config": best_overrides.get("learning", {}),
        },
        "trials": {
            "total": len(trials),
            "early_stopped": sum(1 for t in trials if t["early_stopped"]),
            "failed": sum(1 for t in trials if t["status"] in ("failed", "oom")),
        },
        "notes": notes,
        "agents": services.ledger.agent_usage(services.run_id),
    }
