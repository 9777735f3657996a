"""The schedule stage (stage 3): a bounded best-first tree search over training trajectories.

Training of T steps is cut into S segments (``TuneOptions.schedule_boundaries``). A root trial runs segment 1
with the stage's start config and saves a checkpoint at its end. Expanding a finished node runs K branches
from its checkpoint for the next segment: first the unchanged continuation, then K-1 transitions, each
proposed (with a diagnosis of the trajectory so far), critiqued and reviewed like any candidate. The next
node to expand is picked best-first (``mart.state.schedule.rank_frontier``) among the nodes the budget can
still carry to the horizon; the static path (root and its unchanged continuations) is always completed, as the
reference; the budget counts segment-trials. The winner is the best complete path, with the close ones
re-evaluated on a second seed when the budget allows.

The tree lives in the ledger (``trials`` rows of stage ``schedule``: ``parent_trial``, ``parent_checkpoint``,
``parent_step``, ``horizon`` = the segment's last global step); graph state keeps only the node being
expanded and the ids already expanded, so a resumed session rebuilds the same tree.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from langgraph.types import Command

from mart.state.models import TrialRecord
from mart.state.objectives import collapse_signals, validation_noise, validation_series
from mart.state.schedule import (
    Node,
    children,
    path_to,
    pick_schedule_winner,
    rank_frontier,
    recheck_plan,
    static_path,
    usable,
)
from mart.state.trials import checkpoint_dir

STAGE = "schedule"
RECHECK_RUNS = 2  # budget kept for re-evaluating close complete schedules, when the budget has room for it
CONFIRM_SEED_OFFSET = 1
FALLBACK_NOISE_SHARE = 0.02  # as stage 2: 2% of the root's score when no path has enough validation points


def initial_state() -> dict[str, Any]:
    return {"expanding": None, "expanded": [], "notes": []}


def schedule_state(state: dict[str, Any]) -> dict[str, Any]:
    return {**initial_state(), **(state.get("schedule") or {})}


# --- the tree, from the ledger ----------------------------------------------------------------------------
def tree_nodes(services, *, with_signals: bool = True, prior_noise: float | None = None) -> tuple[list[Node], float]:
    """The stage's nodes (one per segment-trial, re-evaluations included) and the measured score noise: the
    median residual noise of the nodes' validation curves, else ``prior_noise`` (stage 2's, measured over the
    same kind of trials), else 2% of the root's score."""
    options = services.options
    ledger = services.ledger
    bounds = options.schedule_boundaries()
    nodes: list[Node] = []
    for r in ledger.trials(STAGE):
        to = r.get("horizon")
        nodes.append({
            "id": r["trial_id"], "parent": r.get("parent_trial"), "confirms": r.get("confirms"),
            "depth": bounds.index(to) + 1 if to in bounds else 0, "from_step": r.get("parent_step") or 0,
            "to_step": to, "changes": r.get("overrides") or {}, "status": r.get("status"), "score": r.get("score"),
            "early_stopped": bool(r.get("early_stopped")), "kind": r.get("kind"), "config": r.get("config") or {},
            "trial_dir": r.get("trial_dir"), "candidate_id": r.get("candidate_id"), "reason": r.get("reason"),
        })
    if not with_signals:
        return nodes, 0.0
    prefix = services.backend.score_metric_prefix
    rules: dict[str, list[str]] = {}
    for e in ledger.health_events():
        rules.setdefault(e.trial_id, []).append(e.rule)
    cache: dict[str, list] = {}
    noises = []
    for n in nodes:
        if usable(n):
            n["_records"] = path_records(ledger, nodes, n["id"], cache)
            v = validation_noise(validation_series(n["_records"], prefix))
            if v is not None:
                noises.append(v)
    root = next((n for n in nodes if n["parent"] is None and not n["confirms"]), None)
    if noises:
        noise = statistics.median(noises)
    elif prior_noise:
        noise = float(prior_noise)
    else:
        noise = FALLBACK_NOISE_SHARE * abs((root or {}).get("score") or 0.0)
    for n in nodes:
        if "_records" in n:
            fired = [r for p in path_to(nodes, n["id"]) for r in rules.get(p["id"], [])]
            n["signals"] = collapse_signals(n.pop("_records"), fired, noise, prefix)
    return nodes, noise


def path_records(ledger, nodes: list[Node], node_id: str, cache: dict[str, list] | None = None) -> list:
    """The metric records of the trajectory root → ``node_id``: each node's steps after its parent's end (a
    branch's first record repeats the parent's validation at the branch point)."""
    cache = {} if cache is None else cache
    out = []
    start = -1
    for n in path_to(nodes, node_id):
        if n["id"] not in cache:
            cache[n["id"]] = ledger.metric_records(n["id"])
        out += [r for r in cache[n["id"]] if r.step > start]
        start = n["to_step"] or start
    return out


def path_trials(nodes: list[Node], node_id: str) -> list[str]:
    return [n["id"] for n in path_to(nodes, node_id)]


# --- records of new segment-trials ----------------------------------------------------------------------
def next_boundary(options, step: int) -> int:
    return next(b for b in options.schedule_boundaries() if b > step)


def prepare_trial(state: dict[str, Any], services, record: TrialRecord) -> tuple[TrialRecord, int]:
    """The schedule trial ``record`` with its place in the tree filled in, and its last global step.

    The root runs segment 1; a proposed branch (built by the review node) starts from the checkpoint of the
    node being expanded; records that already name their parent (static continuations, re-evaluations) keep it.
    """
    options = services.options
    bounds = options.schedule_boundaries()
    update: dict[str, Any] = {}
    if record.kind == "baseline" and record.parent_trial is None:
        to = bounds[0]
    else:
        if record.parent_trial is None:
            parent = schedule_state(state)["expanding"]
            row = services.ledger.trial(parent) or {}
            step = int(row.get("horizon") or 0)
            update.update(parent_trial=parent, parent_step=step,
                          parent_checkpoint=checkpoint_dir(str(row.get("trial_dir")), step))
        to = next_boundary(options, int(update.get("parent_step") or record.parent_step or 0))
    if to < bounds[-1] and record.kind != "confirm":
        update["save_steps"] = [to]  # the next boundary's branches start here
    return (record.model_copy(update=update) if update else record), to


def child_record(state, services, parent: Node, *, kind: str = "candidate", confirms: str | None = None,
                 seed: int | None = None, config: dict | None = None, suffix: str = "static") -> TrialRecord:
    """A segment-trial from ``parent``'s checkpoint: the unchanged continuation, or a re-evaluation."""
    seq = state.get("trial_seq", 0) + 1
    step = int(parent["to_step"])
    return TrialRecord(
        trial_id=f"{confirms}-s{CONFIRM_SEED_OFFSET + 1}" if confirms else f"sch-{seq:02d}-{suffix}",
        stage=STAGE, kind=kind, config=dict(config if config is not None else parent["config"]),
        parent_trial=parent["id"], parent_step=step,
        parent_checkpoint=checkpoint_dir(str(parent["trial_dir"]), step), seed=seed, confirms=confirms,
    )


def start_config(state: dict[str, Any], services) -> dict[str, Any]:
    """The schedule's segment-1 config: the learning stage's base with its winner's overrides when it ran."""
    from mart.nodes.stage_control import stage_base_config

    return {**stage_base_config(state, services, "learning"),
            **(state.get("best_overrides") or {}).get("learning", {})}


def base_config(state: dict[str, Any], services) -> dict[str, Any]:
    """What the schedule's candidates apply to: the config of the node being expanded (the root's start config
    before the first expansion)."""
    expanding = schedule_state(state)["expanding"]
    if expanding:
        row = services.ledger.trial(expanding)
        if row is not None:
            return dict(row.get("config") or {})
    return start_config(state, services)


def changes_of(state: dict[str, Any], services, record: TrialRecord) -> dict[str, Any]:
    """The knobs a schedule trial changes against its parent's config (the transition; {} = unchanged)."""
    parent = services.ledger.trial(record.parent_trial) if record.parent_trial else None
    ref = dict(parent.get("config") or {}) if parent else start_config(state, services)
    return {k: v for k, v in record.config.items() if ref.get(k, object()) != v}


# --- control ----------------------------------------------------------------------------------------------
def schedule_control(state: dict[str, Any], services) -> Command:
    """After each schedule trial (or an expansion that ran out of proposals): the next branch, the next
    expansion, the static path's completion, a re-evaluation, or the result."""
    from mart.nodes.stage_control import out_of_time

    options = services.options
    bounds = options.schedule_boundaries()
    depth, k = len(bounds), options.schedule_branches
    budget = options.schedule_trial_budget()
    sched = schedule_state(state)
    expanded: list[str] = list(sched["expanded"])
    expanding: str | None = sched["expanding"]
    notes: list[str] = list(sched["notes"])
    exhausted = dict(state.get("exhausted") or {})
    nodes, noise = tree_nodes(services, prior_noise=((state.get("selection") or {}).get("learning") or {}).get("noise"))
    used = len(nodes)
    root = next((n for n in nodes if n["parent"] is None and not n["confirms"]), None)
    if root is None or not usable(root):
        why = "no root segment" if root is None else f"the root segment {root['id']} ended {root['status']}" + (
            f" ({root['reason']})" if root.get("reason") else "")
        return _finalize(state, services, nodes, noise, [*notes, f"{why}: no schedule"])
    if out_of_time(state, options):
        return _finalize(state, services, nodes, noise, [*notes, "wall-clock budget spent"])

    spine = static_path(nodes)
    spine_open = usable(spine[-1]) and spine[-1]["depth"] < depth
    spine_missing = depth - spine[-1]["depth"] if spine_open else 0
    # one full expansion per boundary down a changed path, and the static path beside it
    minimal = 1 + (depth - 1) * k + max(0, depth - 2)
    search_budget = budget - (RECHECK_RUNS if budget >= minimal + RECHECK_RUNS else 0)

    def affords(node: Node) -> bool:
        """Whether one more branch from ``node`` still leaves room to carry it to the horizon (one unchanged
        continuation per later segment) and to complete the static path."""
        return used + 1 + (depth - node["depth"] - 1) + spine_missing <= search_budget

    def keep(**extra: Any) -> dict[str, Any]:
        return {"schedule": {**sched, "expanding": expanding, "expanded": expanded, "notes": notes, **extra}}

    by_id = {n["id"]: n for n in nodes}
    while True:
        if expanding is not None:
            parent = by_id[expanding]
            kids = children(nodes, expanding)
            if exhausted.get(STAGE):
                notes.append(f"expansion of {expanding} ended after {len(kids)} branches: {exhausted.pop(STAGE)}")
            elif not any(not c["changes"] for c in kids):
                extends_spine = expanding == spine[-1]["id"] and spine_open
                if used < budget and (extends_spine or affords(parent)):
                    return Command(goto="launch_trial", update={
                        **keep(), "exhausted": exhausted, "pending_trial": child_record(state, services, parent)})
            elif len(kids) < k and affords(parent):
                return Command(goto="proposer", update={**keep(), "exhausted": exhausted, "round": 0})
            expanding = None
        # best first among the nodes whose expansion the budget still allows (deeper ones as it runs out)
        nxt = next((n for n in rank_frontier(nodes, depth, noise, set(expanded))
                    if (n["id"] == spine[-1]["id"] and spine_open and used < budget) or affords(n)), None)
        if nxt is None:
            break
        expanding = nxt["id"]
        expanded.append(expanding)
    # the static path to the horizon: the reference every schedule is compared with
    if spine_open and used < budget:
        return Command(goto="launch_trial", update={
            **keep(), "exhausted": exhausted, "pending_trial": child_record(state, services, spine[-1])})
    for leaf_id in recheck_plan(nodes, depth, noise):
        if any(n.get("confirms") == leaf_id for n in nodes):
            continue
        if used >= budget:
            break
        leaf = by_id[leaf_id]
        parent = by_id[leaf["parent"]]
        rec = child_record(state, services, parent, kind="confirm", confirms=leaf_id,
                           seed=options.seed + CONFIRM_SEED_OFFSET, config=leaf["config"])
        return Command(goto="launch_trial", update={**keep(), "exhausted": exhausted, "pending_trial": rec})
    return _finalize(state, services, nodes, noise, notes, expanded=expanded)


def _finalize(state, services, nodes: list[Node], noise: float, notes: list[str],
              expanded: list[str] | None = None) -> Command:
    from mart.nodes.stage_control import stage_base_config

    options = services.options
    depth = len(options.schedule_boundaries())
    sched = schedule_state(state)
    winner, ranked = pick_schedule_winner(nodes, depth, noise) if nodes else (None, [])
    by_id = {n["id"]: n for n in nodes}
    base = stage_base_config(state, services, "learning")
    static = next((c for c in ranked if c.is_baseline), None)
    result: dict[str, Any] = {
        "segments": [], "final_score": None, "final_score_spread": None, "final_score_runs": 0,
        "static_best_score": _round(static.mean) if static else None, "gain": None,
        "branches_run": len(nodes), "budget": options.schedule_trial_budget(), "noise": _round(noise),
        "boundaries": options.schedule_boundaries(), "winner": None,
        "reevaluated": sorted({n["confirms"] for n in nodes if n.get("confirms")}),
        "tree": [_tree_row(n) for n in nodes], "notes": list(notes),
    }
    update: dict[str, Any] = {}
    if winner is not None:
        path = path_to(nodes, winner.key)
        result["segments"] = [
            {"from_step": n["from_step"], "to_step": n["to_step"],
             "overrides": {k: v for k, v in n["config"].items() if base.get(k, object()) != v},
             "changes": dict(n["changes"]), "trial_id": n["id"]} for n in path]
        result.update(final_score=_round(winner.mean), final_score_spread=_round(winner.spread),
                      final_score_runs=len(winner.scores), winner=winner.key)
        if static is not None:
            result["gain"] = _round(winner.mean - static.mean)
        leaf = by_id[winner.key]
        rec = TrialRecord(trial_id=leaf["id"], stage=STAGE, kind=leaf["kind"] or "candidate",
                          candidate_id=leaf.get("candidate_id"), config=leaf["config"], status=leaf["status"],
                          score=leaf["score"], steps_done=leaf["to_step"] or 0, parent_trial=leaf["parent"])
        update["best"] = {**(state.get("best") or {}), STAGE: rec}
        update["best_overrides"] = {**(state.get("best_overrides") or {}), STAGE: result["segments"][-1]["overrides"]}
    elif not any(usable(n) and n["depth"] == depth for n in nodes):
        result["notes"].append("no complete schedule reached the horizon")
    services.ledger.set_stage_result(
        services.run_id, STAGE, baseline_trial=static.key if static else None,
        best_trial=winner.key if winner else None, baseline_value=static.mean if static else None,
        best_value=winner.mean if winner else None, best_config={"segments": result["segments"]},
        note="; ".join(result["notes"]))
    update["schedule"] = {**sched, "expanding": None, "expanded": expanded if expanded is not None
                          else sched["expanded"], "notes": notes, "result": result}
    update["exhausted"] = {k: v for k, v in (state.get("exhausted") or {}).items() if k != STAGE}
    return Command(goto="finish", update=update)


def _tree_row(n: Node) -> dict[str, Any]:
    return {"trial_id": n["id"], "parent": n["parent"], "from_step": n["from_step"], "to_step": n["to_step"],
            "changes": dict(n["changes"]), "status": n["status"], "score": _round(n["score"]),
            "early_stopped": n["early_stopped"], "signals": list(n.get("signals") or []),
            "confirms": n.get("confirms")}


def _round(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 6)


def diagnosis_input(state: dict[str, Any], services) -> tuple[list, list, tuple[int, int] | None]:
    """The expanding node's path metric records, its health events, and the segment to propose for."""
    expanding = schedule_state(state)["expanding"]
    if not expanding:
        return [], [], None
    nodes, _ = tree_nodes(services, with_signals=False)
    node = next((n for n in nodes if n["id"] == expanding), None)
    if node is None:
        return [], [], None
    ids = set(path_trials(nodes, expanding))
    events = [e for e in services.ledger.health_events() if e.trial_id in ids]
    step = int(node["to_step"])
    return path_records(services.ledger, nodes, expanding), events, (step, next_boundary(services.options, step))


__all__ = ["schedule_control", "prepare_trial", "base_config", "changes_of", "diagnosis_input", "initial_state",
           "tree_nodes", "path_records", "start_config"]
