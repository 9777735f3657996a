"""Stage control: runs the stage protocol (``mart.nodes.stages``). It starts the session, asks the current stage what
to do with the free trial slots, hands a finished stage over to the next one, and assembles the final summary."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes import stages
from mart.nodes.progress import SessionNote, emit
from mart.nodes.runtime import Services, ensure_run, services_for
from mart.nodes.stages import StageView
from mart.state.graph_state import GRAPH_VERSION, Batch, TuningState, running_trials
from mart.state.text import one_line
from mart.state.trial_state import TrialState
from mart.state.trials import HANDLE_REFUSED


def enter_stage(state: Mapping[str, Any], services: Services, stage: str) -> dict[str, Any]:
    """The state update that starts ``stage`` (its baseline comes from its first plan)."""
    update: dict[str, Any] = {"stage": stage, "round": 0, "feedback": [], "batch": None, "waiting": {}}
    update.update(stages.get(stage).enter(StageView({**state, **update}, services)))
    return update


def start_session(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["stage_control"]]:
    """Initialise counters on the first step (a no-op when resuming a started session).

    A session started from options only (LangGraph Studio) gets its run directory here.
    """
    if state.get("stage"):
        return Command(goto="stage_control")
    ids = ensure_run(state)
    services = services_for({**state, **ids}, runtime)
    services.ledger.upsert_run(services.run_id, status="running", options=services.options.model_dump(mode="json"))
    note = services.slots_note()
    if note:
        emit(services, SessionNote(message=note))
    first = (stages.session_stages(services.options) or ["system"])[0]
    fresh: dict[str, Any] = {
        **ids, "graph_version": GRAPH_VERSION, "status": "running", "started_at": time.time(), "trial_seq": 0,
        "trials_done": {}, "profiles": {}, "baseline": {}, "best": {}, "best_overrides": {}, "reviews": 0,
        "exhausted": {}, "running": {}, "queue": [],
    }
    return Command(goto="stage_control", update={**fresh, **enter_stage({**state, **fresh}, services, first)})


def stage_control(state: TuningState, runtime: Runtime[Services]
                  ) -> Command[Literal["profiler", "proposer", "launch_trial", "watch_trial", "stop_trial",
                                       "stage_control", "finish"]]:
    """After every change of the trials in flight: fill the free slots, wait for a running trial, or conclude the
    stage and enter the next one."""
    services = services_for(state, runtime)
    stage: str = state["stage"]
    policy = stages.get(stage)
    view = StageView(state, services)
    free = services.trial_slots() - view.in_flight()
    plan = policy.plan(view, free)
    update = dict(plan.update)
    if plan.stop:  # trials the stage no longer wants (e.g. stage 1's cut at an early look): their slots free first
        running = {rt.record.trial_id: rt.move(TrialState.STOP_REQUESTED, reason=plan.stop[rt.record.trial_id])
                   if rt.record.trial_id in plan.stop else rt for rt in running_trials(state)}
        return Command(goto="stop_trial", update={**update, "running": running})
    if plan.launch:
        return Command(goto="launch_trial", update={**update, "queue": [*view.queued(), *plan.launch]})
    if plan.profile:
        return Command(goto="profiler", update=update)
    if plan.propose:
        return Command(goto="proposer", update={**update, "round": 0, "batch": Batch(want=plan.propose)})
    if running_trials(state):
        return Command(goto="watch_trial", update=update)  # a slot frees when one of them ends
    if not plan.done:
        raise RuntimeError(f"the {stage} stage waits, but no trial is in flight (plan: {plan})")
    # the stage is over: its winner, then the next stage (or the end)
    state = {**state, **update}  # type: ignore[typeddict-item]  # a plain merged view from here on
    out_of_time = view.out_of_time()
    concluded, stop = policy.conclude(StageView(state, services), "wall-clock budget spent" if out_of_time else None)
    update.update(concluded)
    state = {**state, **concluded}  # type: ignore[typeddict-item]
    if out_of_time:
        return Command(goto="finish", update=update)
    if stop:
        skipped = {s: stop for s in stages.session_stages(services.options) if s != stage}
        return Command(goto="finish", update={**update, "exhausted": {**(state.get("exhausted") or {}), **skipped}})
    nxt = stages.next_stage(services.options, stage)
    if nxt is None:
        return Command(goto="finish", update=update)
    return Command(goto="stage_control", update={**update, **enter_stage(state, services, nxt)})


def finish(state: TuningState, runtime: Runtime[Services]) -> dict[str, Any]:
    services = services_for(state, runtime)
    summary = build_summary(state, services)
    services.ledger.upsert_run(services.run_id, status="completed", summary=summary)
    return {"status": "completed", "summary": summary}


def build_summary(state: Mapping[str, Any], services: Services) -> dict[str, Any]:
    """The session's result in the documented JSON shape: each stage's part and notes (``StagePolicy.summary``),
    the trial counts, the agents' usage; ``schedule`` and ``parallel`` only when they apply."""
    parts: dict[str, Any] = {}
    notes: list[str] = []
    for name in stages.STAGES:
        part, stage_notes = stages.get(name).summary(state, services)
        parts.update(part)
        notes += stage_notes
    if services.memory_limit_gb() is None:
        notes.append("memory margin rule off: no memory capacity is known (no GPU visible to the tuner, e.g. trials "
                     "on a Ray cluster); give --memory-capacity-gb to enforce it")
    trials = services.ledger.trials()
    # said even with -q: a row named a process mart did not start (a planted run folder), left alone
    notes += [f"trial {one_line(t['trial_id'])}: {one_line(t['reason'])}" for t in trials
              if str(t.get("reason") or "").startswith(HANDLE_REFUSED)]
    summary = {
        "run_id": services.run_id,
        "status": "completed",
        "stages": stages.session_stages(services.options),
        "system": parts["system"],
        "learning": parts["learning"],
        "trials": {
            "total": len(trials),
            "early_stopped": sum(1 for t in trials if t["early_stopped"]),
            "failed": sum(1 for t in trials if t["status"] in ("failed", "oom")),
        },
        "notes": notes,
        "agents": services.ledger.agent_usage(services.run_id),
        **{k: v for k, v in parts.items() if k not in ("system", "learning")},
    }
    slots_note = services.slots_note()
    if slots_note:
        notes.append(slots_note)
    if services.options.parallel > 1:
        summary["parallel"] = parallel_summary(state, services, trials)
    return summary


def parallel_summary(state: Mapping[str, Any], services: Services, trials: list[dict[str, Any]]) -> dict[str, Any]:
    """How the slots were used: their number, the session's wall time, and the share of slot-time trials ran."""
    slots = services.trial_slots()
    wall = max(1e-9, time.time() - float(state.get("started_at") or time.time()))
    busy = sum(float(t.get("wall_s") or 0.0) for t in trials)
    return {"slots": slots, "asked": services.options.parallel, "wall_s": round(wall, 3),
            "busy_fraction": round(min(1.0, busy / (slots * wall)), 4)}
