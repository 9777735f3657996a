"""Stage control: session start, budgets, the hand-over between stages (system → learning → schedule), and the
final summary. The schedule stage's own control is in ``mart.nodes.schedule_stage``."""

from __future__ import annotations

import math
import time
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

from mart.nodes.runtime import Services, ensure_run, services_for
from mart.state.agents import group_by_agent
from mart.state.graph_state import TuningState
from mart.state.models import Stage, TrialRecord
from mart.state.objectives import (
    RISK_AT_CLIFF,
    RISK_BELOW_COLLAPSE,
    Contender,
    collapse_signals,
    learning_choice,
    move_size,
    next_reevaluation,
    noise_estimate,
    pooled_noise,
    replicate_noise,
    validation_series,
)

STAGES: tuple[Stage, ...] = ("system", "learning", "schedule")


def stage_budget(options, stage: Stage) -> int:
    if stage == "schedule":
        return options.schedule_trial_budget()
    return options.system_trials if stage == "system" else options.learning_trials


def stage_horizon(options, stage: Stage) -> int:
    if stage == "schedule":
        return options.schedule_total_steps()  # a schedule trial's own last step: schedule_stage.prepare_trial
    return options.system_horizon if stage == "system" else options.learning_horizon


def knob_stage(stage: Stage) -> Stage:
    """The search-space stage whose knobs ``stage`` changes (a schedule changes learning knobs per segment)."""
    return "learning" if stage == "schedule" else stage


def stage_base_config(state: dict[str, Any], services, stage: Stage) -> dict[str, Any]:
    """The full config candidates of ``stage`` apply to: the backend's base with the session's ``--set`` values;
    stage 2 fixes stage 1's best system overrides; a schedule branch applies to its parent's config."""
    if stage == "schedule":
        from mart.nodes.schedule_stage import base_config

        return base_config(state, services)
    base = dict(services.backend.base_config())
    base.update(getattr(services.options, "start_overrides", None) or {})
    if stage == "learning":
        base.update((state.get("best_overrides") or {}).get("system", {}))
    return base


def overrides_of(state: dict[str, Any], services, record: TrialRecord) -> dict[str, Any]:
    """The knobs a trial changes relative to its stage's base config (a schedule trial: to its parent's)."""
    if record.stage == "schedule":
        from mart.nodes.schedule_stage import changes_of

        return changes_of(state, services, record)
    base = stage_base_config(state, services, record.stage)
    return {k: v for k, v in record.config.items() if base.get(k, object()) != v}


def session_stages(options) -> list[Stage]:
    """The stages this session runs, in order (stage 2 with a zero budget is skipped)."""
    stages = getattr(options, "stages", None) or ["system", "learning"]
    return [s for s in stages if s != "learning" or options.learning_trials > 0]


def next_stage(options, stage: Stage) -> Stage | None:
    order = session_stages(options)
    later = [s for s in order if STAGES.index(s) > STAGES.index(stage)]
    return later[0] if later else None


def enter_stage(stage: Stage) -> dict[str, Any]:
    """The state update that starts ``stage`` (its baseline or root comes from the profiler)."""
    update: dict[str, Any] = {"stage": stage, "round": 0, "feedback": [], "candidates": [], "critiques": [],
                              "selected": None}
    if stage == "schedule":
        from mart.nodes.schedule_stage import initial_state

        update["schedule"] = initial_state()
    return update


def start_session(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["profiler"]]:
    """Initialise counters on the first step (a no-op when resuming a started session).

    A session started from options only (LangGraph Studio) gets its run directory here.
    """
    if state.get("stage"):
        return Command(goto="profiler")
    ids = ensure_run(state)
    services = services_for({**state, **ids}, runtime)
    services.ledger.upsert_run(services.run_id, status="running", options=services.options.model_dump(mode="json"))
    first = (session_stages(services.options) or ["system"])[0]
    return Command(
        goto="profiler",
        update={
            **ids, **enter_stage(first),
            "status": "running", "started_at": time.time(), "trial_seq": 0,
            "trials_done": {}, "profiles": {}, "baseline": {}, "best": {}, "best_overrides": {},
            "feedback": [], "round": 0, "reviews": 0, "exhausted": {}, "candidates": [], "critiques": [],
            "selected": None, "pending_trial": None, "active": None, "stop_reason": None,
        },
    )


def out_of_time(state, options) -> bool:
    return bool(options.wall_clock_s) and time.time() - state.get("started_at", time.time()) > options.wall_clock_s


def stage_control(state: TuningState, runtime: Runtime[Services]) -> Command[Literal["proposer", "profiler", "launch_trial", "finish"]]:
    """After each finished trial (or a stage that gave up): continue, switch stage, or finish."""
    services = services_for(state, runtime)
    options = services.options
    stage: Stage = state["stage"]
    if stage == "schedule":
        from mart.nodes.schedule_stage import schedule_control

        return schedule_control(state, services)
    done = (state.get("trials_done") or {}).get(stage, 0)
    exhausted = (state.get("exhausted") or {}).get(stage)
    if out_of_time(state, options):
        exhausted = exhausted or "wall-clock budget spent"
    if done < stage_budget(options, stage) and not exhausted:
        return Command(goto="proposer", update={"round": 0})
    update: dict[str, Any] = {}
    if stage == "learning" and not out_of_time(state, options):
        nxt, update = learning_selection(state, services)
        if nxt is not None:
            return Command(goto="launch_trial", update={"pending_trial": nxt, **update})
        state = {**state, **update}
    record_stage_result(state, services, stage, note=exhausted)
    if exhausted and out_of_time(state, options):
        return Command(goto="finish", update=update)
    nxt = next_stage(options, stage)
    if nxt is not None:
        if stage == "system" and (state.get("baseline") or {}).get("system") is not None \
                and not (state.get("best") or {}).get("system"):
            # no system config completed within the memory margin: a later stage would only rerun a failing one
            skipped = {s: "skipped: stage 1 found no feasible system config (see the system notes)"
                       for s in session_stages(options) if s != "system"}
            return Command(goto="finish", update={**update, "exhausted": {**(state.get("exhausted") or {}), **skipped}})
        return Command(goto="profiler", update={**update, **enter_stage(nxt)})
    return Command(goto="finish", update=update)


# --- stage 2: selection under noise (learning stage only) ----------------------------------------------
# After the learning budget is spent, the winner is not taken from one noisy score. One at a time, within
# ``learning_confirm_trials`` re-runs on another seed (kind "confirm"; the defaults' re-run counts too):
# the highest single-run change that could still win is re-run, and the defaults are re-run as soon as a
# re-run change leads them. A change replaces the defaults only with two seeds, a lead over them of more
# than 2 standard errors of the difference (3 when a collapse was seen within two doublings of its lr), no
# collapse signal, and no collapse seen within one doubling of its lr; with weak evidence the smaller move
# from the defaults wins. Pure parts:
# ``mart.state.objectives`` (pooled_noise, collapse_signals, learning_choice, next_reevaluation).

LR_KEY = "actor_rollout_ref.actor.optim.lr"
CONFIRM_SEED_OFFSET = 1  # the re-evaluation seed: the session's seed + 1
FALLBACK_NOISE_SHARE = 0.02  # noise = 2% of the baseline score when no trial has enough validation points
CLIFF_FACTOR = 2.0  # one doubling of the lr: the step the proposers take


def _learning_evidence(state, services) -> tuple[list[Contender], float, float | None, dict[str, dict[str, Any]]]:
    """Contenders (originals with their confirmations), the pooled noise and its degrees of freedom (None:
    a fallback guess), and the ledger rows by trial id."""
    ledger = services.ledger
    prefix = services.backend.score_metric_prefix
    rows = {r["trial_id"]: r for r in ledger.trials("learning")}
    events: dict[str, list[str]] = {}
    for e in ledger.health_events():
        events.setdefault(e.trial_id, []).append(e.rule)
    used: list[tuple[str, dict[str, Any], bool, list]] = []
    estimates: list[tuple[float, int]] = []
    for tid, row in rows.items():
        key = row.get("confirms") or tid
        if key not in rows or rows[key].get("kind") not in ("baseline", "candidate"):
            continue
        usable = row.get("status") == "completed" and row.get("score") is not None
        if not usable and row.get("kind") != "confirm":
            continue  # an original that failed is no contender; a failed re-evaluation is evidence against it
        records = ledger.metric_records(tid)
        est = noise_estimate(validation_series(records, prefix))
        if est is not None and usable and not events.get(tid):
            estimates.append(est)
        used.append((tid, row, usable, records))
    pooled = pooled_noise(estimates)
    noise = pooled[0] if pooled else None
    baseline = (state.get("baseline") or {}).get("learning")
    # per config: the original run first, then its re-evaluations (score or NaN, signals)
    runs: dict[str, list[tuple[float, list[str]]]] = {}
    for tid, row, usable, records in sorted(used, key=lambda u: (u[1].get("confirms") is not None, u[1].get("seq") or 0)):
        signals = collapse_signals(records, events.get(tid, []), noise, prefix) if usable else []
        if row.get("early_stopped") or not usable:
            signals.append(f"run {tid} ended {row.get('status')}" + (" early" if row.get("early_stopped") else ""))
        runs.setdefault(row.get("confirms") or tid, []).append((float(row["score"]) if usable else math.nan, signals))
    # the seed-to-seed spread of configs re-run without a collapse signal measures the same noise directly
    for rs in runs.values():
        est = replicate_noise([s for s, _ in rs]) if all(not sig and not math.isnan(s) for s, sig in rs) else None
        if est is not None:
            estimates.append(est)
    pooled = pooled_noise(estimates) or pooled
    noise, dof = pooled if pooled else (None, None)
    if noise is None:
        noise = FALLBACK_NOISE_SHARE * abs(baseline.score or 0.0) if baseline is not None else 0.0
    # the collapse hazard rises steeply with the learning rate (lr 50x too high collapses Qwen3-0.6B): one or
    # two lucky seeds of a config near a collapse are no proof of safety. Against the lowest raised lr that
    # collapsed (stopped by the health monitor, oom or failed) at or above its own: less than one doubling
    # away = at the cliff edge (never replaces the defaults), less than two = below a collapse (needs a
    # larger lead), further down = no risk inferred
    collapsed = [(tid, _lrs(r)) for tid, r in rows.items() if r.get("early_stopped") or r.get("status") in ("oom", "failed")]
    base_lrs = _lrs(rows.get(baseline.trial_id, {})) if baseline is not None else {}
    stage_base = stage_base_config(state, services, "learning")
    contenders = []
    for key, rs in runs.items():
        scores = [s for s, _ in rs if not math.isnan(s)]
        if not scores or math.isnan(rs[0][0]):
            continue
        c = Contender(key=key, scores=scores, signals=[x for _, sig in rs for x in sig],
                      is_baseline=rows[key].get("kind") == "baseline")
        c.first_signals = list(rs[0][1])
        c.move = 0.0 if c.is_baseline else move_size(rows[key].get("overrides") or {}, stage_base)
        # per lr knob it raised (one per agent in a multi-agent job): the nearest collapse at or above it
        near = sorted((clrs[k] / lr, k, tid) for k, lr in _lrs(rows[key]).items() if k in base_lrs and lr > base_lrs[k]
                      for tid, clrs in collapsed if tid != key and clrs.get(k, 0.0) >= lr)
        if near and near[0][0] < CLIFF_FACTOR ** 2:
            ratio, k, tid = near[0]
            c.risk = RISK_AT_CLIFF if ratio < CLIFF_FACTOR else RISK_BELOW_COLLAPSE
            c.risk_why = f"{k} {_lrs(rows[key])[k]:g} raised, and a trial at {ratio:.3g}x it collapsed ({tid})"
        contenders.append(c)
    return contenders, noise, dof, rows


def _lrs(row: dict[str, Any]) -> dict[str, float]:
    """The actor learning rate(s) of a trial's config: verl's key, or one per agent (``agents.<i>.<key>``)."""
    out = {}
    for k, v in (row.get("config") or {}).items():
        if k == LR_KEY or k.endswith("." + LR_KEY):
            try:
                out[k] = float(v)
            except (TypeError, ValueError):
                continue
    return out


def learning_selection(state, services) -> tuple[TrialRecord | None, dict[str, Any]]:
    """The next re-evaluation to run, or None and the state update naming the final learning winner.

    Each call decides from the finished trials in the ledger only, so a resumed session makes the same choice.
    """
    options = services.options
    contenders, noise, dof, rows = _learning_evidence(state, services)
    if not contenders:
        return None, {}
    confirms = sorted((r for r in rows.values() if r.get("kind") == "confirm"), key=lambda r: r.get("seq") or 0)
    budget = getattr(options, "learning_confirm_trials", 3)
    if len(confirms) < budget:
        c = next_reevaluation(contenders, noise, {r.get("confirms") for r in confirms}, dof=dof)
        if c is not None:
            tid = f"{c.key}-s{CONFIRM_SEED_OFFSET + 1}"
            orig = rows[c.key]
            # no candidate_id: the candidate was approved and ran once; `confirms` links the re-evaluation to it
            return TrialRecord(trial_id=tid, stage="learning", kind="confirm", config=orig["config"],
                               seed=options.seed + CONFIRM_SEED_OFFSET, confirms=c.key), {}
    winner, why = learning_choice(contenders, noise, dof=dof)
    ranked = sorted(contenders, key=lambda c: -c.mean)
    selection = {
        "winner": winner.key, "mean": winner.mean, "spread": winner.spread, "runs": len(winner.scores),
        "noise": noise, "noise_dof": None if dof is None else round(dof, 1), "reevaluated": [r.get("confirms") for r in confirms], "confirm_budget": budget,
        "why": why,
        "contenders": [{"trial_id": c.key, "mean": round(c.mean, 6), "runs": len(c.scores),
                        "spread": None if c.spread is None else round(c.spread, 6), "move": round(c.move, 3),
                        "signals": c.signals + ([c.risk_why] if c.risk_why else [])}
                       for c in ranked],
    }
    update: dict[str, Any] = {"selection": {**(state.get("selection") or {}), "learning": selection}}
    best = dict(state.get("best") or {})
    incumbent = best.get("learning")
    if incumbent is None or incumbent.trial_id != winner.key:
        row = rows[winner.key]
        rec = TrialRecord(trial_id=winner.key, stage="learning", kind=row.get("kind") or "candidate",
                          candidate_id=row.get("candidate_id"), config=row.get("config") or {},
                          status=row.get("status"), score=row.get("score"), steps_done=row.get("steps_done") or 0)
        best["learning"] = rec
        best_overrides = dict(state.get("best_overrides") or {})
        best_overrides["learning"] = {} if winner.is_baseline else (row.get("overrides") or {})
        update.update(best=best, best_overrides=best_overrides)
    return None, update


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


def config_by_agent(overrides: dict[str, Any]) -> dict[str, Any] | None:
    """A multi-agent job's best config split into shared knobs and each agent's (``agents.<i>.*``); None when
    no knob belongs to an agent."""
    shared, per_agent = group_by_agent(overrides or {})
    if not per_agent:
        return None
    return {"shared": shared, "per_agent": {str(a): knobs for a, knobs in per_agent.items()}}


def build_summary(state, services) -> dict[str, Any]:
    """The session's result in the documented JSON shape (plus ``notes`` and agent usage)."""
    baseline = state.get("baseline") or {}
    best = state.get("best") or {}
    best_overrides = state.get("best_overrides") or {}
    exhausted = state.get("exhausted") or {}
    sys_base, sys_best = baseline.get("system"), best.get("system")
    learn_base, learn_best = baseline.get("learning"), best.get("learning")
    sel = (state.get("selection") or {}).get("learning") or {}
    b_thr = sys_base.throughput if sys_base else None
    t_thr = sys_best.throughput if sys_best else None
    gain = (t_thr / b_thr - 1) * 100 if b_thr and t_thr else None
    b_score = learn_base.score if learn_base else None
    t_score = learn_best.score if learn_best else None
    if sel and learn_best is not None and sel.get("winner") == learn_best.trial_id:
        t_score = sel["mean"]  # the mean over its runs (seeds), not its luckiest run
        base_row = next((c for c in sel.get("contenders", []) if learn_base and c["trial_id"] == learn_base.trial_id), None)
        b_score = base_row["mean"] if base_row else b_score
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
    sched = (state.get("schedule") or {}).get("result")
    if sched is not None:
        notes += [f"schedule stage: {n}" for n in sched.get("notes", [])]
    elif "schedule" in session_stages(services.options) and exhausted.get("schedule"):
        notes.append(f"schedule stage: {exhausted['schedule']}")
    if services.memory_limit_gb() is None:
        notes.append("memory margin rule off: no memory capacity is known (no GPU visible to the tuner, e.g. trials "
                     "on a Ray cluster); give --memory-capacity-gb to enforce it")
    return {
        "run_id": services.run_id,
        "status": "completed",
        "stages": session_stages(services.options),
        "system": {
            "baseline_throughput": _clean(b_thr),
            "best_throughput": _clean(t_thr),
            "throughput_gain_pct": _clean(gain),
            "best_config": best_overrides.get("system", {}),
            "best_config_by_agent": config_by_agent(best_overrides.get("system", {})),
            "memory_limit_gb": _clean(services.memory_limit_gb()),
            "best_peak_memory_gb": _clean(sys_best.peak_memory_gb if sys_best else None),
        },
        "learning": {
            "baseline_score": _clean(b_score),
            "best_score": _clean(t_score),
            "score_gain": _clean(t_score - b_score) if t_score is not None and b_score is not None else None,
            "best_config": best_overrides.get("learning", {}),
            "best_config_by_agent": config_by_agent(best_overrides.get("learning", {})),
            # selection under noise: the winner's score is a mean over `best_score_runs` seeds
            "best_score_spread": _clean(sel.get("spread")),
            "best_score_runs": sel.get("runs", 1 if learn_best else 0),
            "score_noise": _clean(sel.get("noise")),
            "reevaluated": sel.get("reevaluated", []),
            "contenders": sel.get("contenders", []),
        },
        "trials": {
            "total": len(trials),
            "early_stopped": sum(1 for t in trials if t["early_stopped"]),
            "failed": sum(1 for t in trials if t["status"] in ("failed", "oom")),
        },
        "notes": notes,
        "agents": services.ledger.agent_usage(services.run_id),
        **({"schedule": schedule_summary(sched)} if sched is not None else {}),
    }


def schedule_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The schedule stage's part of the summary: the winning schedule's segments, its final score against the
    static config's at equal total steps, and the tree (one row per segment-trial)."""
    keys = ("segments", "final_score", "final_score_spread", "final_score_runs", "static_best_score", "gain",
            "branches_run", "budget", "boundaries", "noise", "winner", "reevaluated", "tree")
    return {k: result.get(k) for k in keys}
