"""Stage 3, ``schedule``: a bounded best-first tree search over training trajectories (LLMZero, arXiv 2606.18388).

Training of T steps is cut into S segments (``TuneOptions.schedule_boundaries``). A root trial runs segment 1
with the stage's start config and saves a checkpoint at its end. Expanding a finished node runs K branches
from its checkpoint for the next segment: the unchanged continuation, and K-1 transitions, each proposed (with a
diagnosis of the trajectory so far), critiqued and reviewed like any candidate; with free slots they run side by
side (the continuation first, the transitions as one batch and one review). The next node to expand is picked
best-first (``mart.state.schedule.rank_frontier``) among the nodes the budget can still carry to the horizon, once
nothing of the last expansion runs; the static path (root and its unchanged continuations) is always completed,
as the reference; the budget counts segment-trials. The winner is the best complete path, with the close ones
re-evaluated on a second seed when the budget allows.

The tree lives in the ledger (``trials`` rows of stage ``schedule``: ``parent_trial``, ``parent_checkpoint``,
``parent_step``, ``horizon`` = the segment's last global step); graph state keeps only the node being
expanded and the ids already expanded, so a resumed session rebuilds the same tree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mart.nodes.stages._base import Plan, StagePolicy, StageView
from mart.nodes.stages.capacity import (
    capacity_errors,
    halved_micro_batches,
    implied_caps,
    memory_trend,
    projected_peak,
)
from mart.nodes.stages.learning import CONFIRM_SEED_OFFSET, FALLBACK_NOISE_SHARE, LearningStage
from mart.state.models import TrialRecord
from mart.state.objectives import (
    baseline_verdict,
    collapse_signals,
    pooled_validation_noise,
    validation_series,
)
from mart.state.schedule import (
    TIE_Z,
    Node,
    children,
    deciding_rerun,
    gpu_hours,
    path_gpu_hours,
    path_to,
    pick_schedule_winner,
    rank_frontier,
    recheck_plan,
    schedule_gain_interval,
    search_gpu_hours,
    static_path,
    usable,
)
from mart.state.stages import SCHEDULE_TRAITS
from mart.state.trials import checkpoint_dir

if TYPE_CHECKING:
    from mart.nodes.agents.base import AgentContext

STAGE = "schedule"
RECHECK_RUNS = 2  # budget kept for re-evaluating close complete schedules, when the budget has room for it


def initial_state() -> dict[str, Any]:
    return {"expanding": None, "expanded": [], "notes": []}


def schedule_state(state: Mapping[str, Any]) -> dict[str, Any]:
    return {**initial_state(), **(state.get("schedule") or {})}


# --- the tree, from the ledger ----------------------------------------------------------------------------
def tree_nodes(services: Any, *, with_signals: bool = True, prior_noise: float | None = None) -> tuple[list[Node], float]:
    """The stage's nodes (one per segment-trial, re-evaluations and trials in flight included) and the measured
    score noise: the nodes' validation curves' residual noise, pooled (``objectives.pooled_validation_noise``), else ``prior_noise`` (stage 2's,
    measured over the same kind of trials), else 2% of the root's score."""
    options = services.options
    ledger = services.ledger
    bounds = options.schedule_boundaries()
    nodes: list[Node] = []
    neutral = memory_keys(services)
    for r in ledger.trials(STAGE):
        to = r.get("horizon")
        over = r.get("overrides") or {}
        nodes.append({
            "id": r["trial_id"], "parent": r.get("parent_trial"), "confirms": r.get("confirms"),
            "depth": bounds.index(to) + 1 if to in bounds else 0, "from_step": r.get("parent_step") or 0,
            "to_step": to, "status": r.get("status"), "score": r.get("score"),
            # a halved micro batch changes no learning: a continuation with only that is still the unchanged one
            "changes": {k: v for k, v in over.items() if k not in neutral},
            "memory_moves": {k: v for k, v in over.items() if k in neutral},
            "early_stopped": bool(r.get("early_stopped")), "kind": r.get("kind"), "config": r.get("config") or {},
            "trial_dir": r.get("trial_dir"), "candidate_id": r.get("candidate_id"), "reason": r.get("reason"),
            "seed": r.get("seed"),
        })
    mark_memory_retries(nodes, neutral)
    if not with_signals:
        return nodes, 0.0
    prefix = services.backend.score_metric_prefix
    rules: dict[str, list[str]] = {}
    for e in ledger.health_events():
        rules.setdefault(e.trial_id, []).append(e.rule)
    cache: dict[str, list] = {}
    curves = []
    for n in nodes:
        if usable(n):
            n["_records"] = path_records(ledger, nodes, n["id"], cache)
            curves.append(validation_series(n["_records"], prefix))
    root = next((n for n in nodes if n["parent"] is None and not n["confirms"]), None)
    pooled = pooled_validation_noise(curves)
    if pooled is not None:
        noise = pooled
    elif prior_noise:
        noise = float(prior_noise)
    else:
        noise = FALLBACK_NOISE_SHARE * abs((root or {}).get("score") or 0.0)
    for n in nodes:
        if "_records" in n:
            fired = [r for p in path_to(nodes, n["id"]) for r in rules.get(p["id"], [])]
            n["signals"] = collapse_signals(n.pop("_records"), fired, noise, prefix)
    # issue 24 (port): what each segment-trial cost, from its own timings
    for n in nodes:
        n["gpu_hours"] = gpu_hours(cache[n["id"]] if n["id"] in cache else ledger.metric_records(n["id"]), n["config"])
    return nodes, noise


def memory_keys(services: Any) -> set[str]:
    """The backend's micro batches (``ParamSpec.memory_safe``): knobs that change a phase's memory, no learning."""
    space = getattr(services.backend, "search_space", None)
    return {p.key for p in space().params if p.memory_safe} if callable(space) else set()


def mark_memory_retries(nodes: list[Node], neutral: set[str]) -> None:
    """A segment-trial that ran out of memory and was re-run (a later node from the same checkpoint, re-evaluating
    the same leaf, with the same config but its micro batches) is ``superseded`` by that re-run (``retry_of``)."""
    def learning(n: Node) -> dict[str, Any]:
        return {k: v for k, v in n["config"].items() if k not in neutral}

    for i, n in enumerate(nodes):
        if n["status"] != "oom":
            continue
        for m in nodes[i + 1:]:
            if m["parent"] == n["parent"] and m.get("confirms") == n.get("confirms") and learning(m) == learning(n):
                n["superseded"], m["retry_of"] = True, n["id"]
                break


def path_records(ledger: Any, nodes: list[Node], node_id: str, cache: dict[str, list] | None = None) -> list:
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


def next_boundary(options: Any, step: int) -> int:
    return next(b for b in options.schedule_boundaries() if b > step)


def diagnosis_input(state: Mapping[str, Any], services: Any) -> tuple[list, list, tuple[int, int] | None]:
    """The expanding node's path metric records, its health events, and the segment to propose for."""
    expanding = schedule_state(state)["expanding"]
    if not expanding:
        return [], [], None
    nodes, _ = tree_nodes(services, with_signals=False)
    node = next((n for n in nodes if n["id"] == expanding), None)
    if node is None:
        return [], [], None
    ids = {n["id"] for n in path_to(nodes, expanding)}
    events = [e for e in services.ledger.health_events() if e.trial_id in ids]
    step = int(node["to_step"])
    return path_records(services.ledger, nodes, expanding), events, (step, next_boundary(services.options, step))


def _round(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 6)


def _tree_row(n: Node) -> dict[str, Any]:
    return {"trial_id": n["id"], "parent": n["parent"], "from_step": n["from_step"], "to_step": n["to_step"],
            "changes": {**n["changes"], **n.get("memory_moves", {})}, "status": n["status"], "score": _round(n["score"]),
            "early_stopped": n["early_stopped"], "signals": list(n.get("signals") or []),
            "confirms": n.get("confirms"), "gpu_hours": _round(n.get("gpu_hours"))}


def schedule_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The schedule stage's part of the summary: the winning schedule's segments, its final score against the
    static config's at equal total steps, and the tree (one row per segment-trial)."""
    keys = ("segments", "final_score", "final_score_spread", "final_score_runs", "static_best_score", "gain",
            "gpu_hours", "static_gpu_hours", "search_gpu_hours",  # issue 24: the schedule's cost beside its score
            "branches_run", "budget", "boundaries", "noise", "winner", "reevaluated", "tree",
            "gain_interval")  # the winner's (else the best schedule's) gain over the static one, with its interval
    return {k: result.get(k) for k in keys}


def _result(options: Any, nodes: list[Node], noise: float, static: Any, notes: list[str]) -> dict[str, Any]:
    """The schedule's result before a winner is named: the tree, the budget, the static schedule's figures."""
    return {
        "segments": [], "final_score": None, "final_score_spread": None, "final_score_runs": 0,
        "static_best_score": _round(static.mean) if static else None, "gain": None,
        "branches_run": len(nodes), "budget": options.schedule_trial_budget(), "noise": _round(noise),
        "boundaries": options.schedule_boundaries(), "winner": None,
        "reevaluated": sorted({n["confirms"] for n in nodes if n.get("confirms")}),
        "tree": [_tree_row(n) for n in nodes], "notes": list(notes),
        # issue 24 (port): the schedule's cost beside its score (one training run along the winner's path, the
        # static path's, and the whole search's)
        "gpu_hours": None, "static_gpu_hours": _round(path_gpu_hours(nodes, static.key)) if static else None,
        "search_gpu_hours": _round(search_gpu_hours(nodes)),
    }


def search_budget(budget: int, depth: int, branches: int) -> int:
    """The segment-trials the search may spend before the re-evaluations: ``RECHECK_RUNS`` are kept whenever the
    budget also holds the root's full expansion and a changed path and the static path carried to the horizon
    (without a re-evaluation no schedule can ever be claimed: the winner needs a second run). Later boundaries
    then get fewer branches than the first: a move early is worth more than the same move late (docs/runtime.md,
    the schedule stage's diagnosis)."""
    minimal = 1 + branches + 2 * max(0, depth - 2)
    return budget - (RECHECK_RUNS if budget >= minimal + RECHECK_RUNS else 0)


@dataclass
class Frontier:
    """The schedule's search tree as ``ScheduleStage.plan`` decides from it: the nodes run so far, the budget,
    the expansion in progress and the static path (the root and its unchanged continuations)."""

    sched: dict[str, Any]
    """The stage's kept state (``schedule``) this decision started from."""
    nodes: list[Node]
    noise: float
    depth: int
    """Segments of a complete schedule."""
    branches: int
    """Branches per expansion (K), the unchanged continuation among them."""
    budget: int
    used: int
    """Trials of the stage run or queued."""
    expanding: str | None
    expanded: list[str]
    notes: list[str]
    exhausted: dict[str, str]
    root: Node | None
    by_id: dict[str, Node]
    spine: list[Node]
    spine_open: bool
    """The static path still ends above the horizon (its next continuation is due)."""
    spine_missing: int
    search_budget: int
    """The budget less what is kept for re-evaluating close complete schedules."""

    @classmethod
    def of(cls, view: StageView) -> "Frontier":
        options = view.options
        depth, k, budget = len(options.schedule_boundaries()), options.schedule_branches, options.schedule_trial_budget()
        sched = schedule_state(view.state)
        nodes, noise = tree_nodes(view.services, prior_noise=((view.state.get("selection") or {}).get("learning")
                                                              or {}).get("noise"))
        root = next((n for n in nodes if n["parent"] is None and not n["confirms"]), None)
        spine = static_path(nodes) if root is not None else []
        spine_open = bool(spine) and usable(spine[-1]) and spine[-1]["depth"] < depth
        return cls(sched=sched, nodes=nodes, noise=noise, depth=depth, branches=k, budget=budget,
                   used=len(nodes) + len(view.queued(STAGE)), expanding=sched["expanding"],
                   expanded=list(sched["expanded"]), notes=list(sched["notes"]),
                   exhausted=dict(view.state.get("exhausted") or {}), root=root, by_id={n["id"]: n for n in nodes},
                   spine=spine, spine_open=spine_open, spine_missing=depth - spine[-1]["depth"] if spine_open else 0,
                   search_budget=search_budget(budget, depth, k))

    def affordable(self, node: Node) -> int:
        """How many more branches from ``node`` leave room to carry each to the horizon (one unchanged
        continuation per later segment), to complete the static path and to carry the other live first-boundary
        branches to the horizon (``carried``)."""
        return (self.search_budget - self.used - (self.depth - node["depth"] - 1) - self.spine_missing
                - self.carry_reserve(node))

    def carried(self) -> list[Node]:
        """The live first-boundary branches, each by the deepest node of its unchanged chain: the root's changed
        children that finished healthy within ``TIE_Z`` x the noise of a difference of the best of them. A move
        at the first boundary is worth the most, and its lead at the next boundary is within one measurement's
        noise (docs/runtime.md, the diagnosis): such a branch is carried to the horizon, where the lead is
        largest, rather than dropped on one noisy point."""
        if self.root is None:
            return []
        kids = [c for c in children(self.nodes, self.root["id"]) if usable(c)]
        if not kids:
            return []
        top = max(c["score"] for c in kids)
        tie = TIE_Z * self.noise * math.sqrt(2)
        out = []
        for c in kids:
            if not c["changes"] or c.get("signals") or top - c["score"] > tie:
                continue
            end = c
            while True:  # down its unchanged continuations
                nxt = next((k for k in children(self.nodes, end["id"]) if not k["changes"]), None)
                if nxt is None or not usable(nxt):
                    break
                end = nxt
            out.append(end)
        return out

    def carry_reserve(self, node: Node) -> int:
        """Segment-trials still needed to carry the live first-boundary branches other than ``node``'s own path
        to the horizon."""
        mine = {n["id"] for n in path_to(self.nodes, node["id"])}
        need = 0
        for end in self.carried():
            if end["id"] in mine or end["depth"] >= self.depth:
                continue
            nxt = next((k for k in children(self.nodes, end["id"]) if not k["changes"]), None)
            if nxt is None:
                need += self.depth - end["depth"]
            elif nxt.get("status") == "running":  # counted in ``used``; the rest of the chain is not
                need += self.depth - end["depth"] - 1
            # a continuation that ended unusable: the branch is dead, nothing to carry
        return need

    def extends_spine(self, node_id: str) -> bool:
        """Expanding ``node_id`` continues the open static path, and the budget has room for it."""
        return node_id == self.spine[-1]["id"] and self.spine_open and self.used < self.budget

    def keep(self, **extra: Any) -> dict[str, Any]:
        """The state update that keeps this decision's expansion, notes and exhausted stages."""
        return {"schedule": {**self.sched, "expanding": self.expanding, "expanded": self.expanded,
                             "notes": self.notes, **extra}, "exhausted": self.exhausted}


class ScheduleStage(StagePolicy):
    name = "schedule"
    traits = SCHEDULE_TRAITS
    objective = ("maximise the validation score at the end of training (the last segment's end) by changing learning "
                 "knobs for the next segment, from the checkpoint at its start; branches from the same checkpoint "
                 "compete, the unchanged continuation among them; unhealthy branches are stopped early")

    start_words = "parent branch's configuration"
    tried_words = "from this checkpoint"
    tried_scope = " from this checkpoint"

    def budget(self, options: Any) -> int:
        return options.schedule_trial_budget()

    def horizon(self, options: Any) -> int:
        return options.schedule_total_steps()  # a segment-trial's own last step: ``prepare``

    def enter(self, view: StageView) -> dict[str, Any]:
        return {"schedule": initial_state()}

    # -- configs ----------------------------------------------------------------------------------
    def start_config(self, view: StageView) -> dict[str, Any]:
        """The schedule's segment-1 config: the learning stage's base with its winner's overrides when it ran."""
        return {**LearningStage().base_config(view), **(view.state.get("best_overrides") or {}).get("learning", {})}

    def base_config(self, view: StageView) -> dict[str, Any]:
        """What the schedule's candidates apply to: the config of the node being expanded (the root's start config
        before the first expansion)."""
        expanding = schedule_state(view.state)["expanding"]
        if expanding:
            row = view.ledger.trial(expanding)
            if row is not None:
                return dict(row.get("config") or {})
        return self.start_config(view)

    def overrides_of(self, view: StageView, record: TrialRecord) -> dict[str, Any]:
        """The knobs a schedule trial changes against its parent's config (the transition; {} = unchanged)."""
        parent = view.ledger.trial(record.parent_trial) if record.parent_trial else None
        ref = dict(parent.get("config") or {}) if parent else self.start_config(view)
        return {k: v for k, v in record.config.items() if ref.get(k, object()) != v}

    def current_config(self, view: StageView, record: TrialRecord) -> dict[str, Any]:
        """A branch changes against its parent's config (the root: against the schedule's start config)."""
        parent = view.ledger.trial(record.parent_trial) if record.parent_trial else None
        return dict((parent or {}).get("config") or {}) or self.start_config(view)

    # -- what the agents ask ------------------------------------------------------------------------
    def proposal_start(self, ctx: AgentContext) -> dict[str, Any]:
        """A transition changes the parent branch's config (the base), not a best-so-far."""
        return {}

    def implied(self, ctx: AgentContext, changes: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """A longer response limit brings the token caps it implies (``capacity.implied_caps``)."""
        return implied_caps(ctx, changes)

    def stage_refusals(self, ctx: AgentContext, overrides: dict[str, Any]) -> list[str]:
        """Token caps move only up, with the response limit they follow (``capacity.capacity_errors``)."""
        return capacity_errors(ctx, overrides)

    def duplicate(self, key: str, tried: set[str], siblings: set[str]) -> str | None:
        """Tried from this checkpoint, or another transition of this round (each is remembered in ``siblings``)."""
        why = super().duplicate(key, tried, siblings) or (
            "duplicate of another transition in this round" if key in siblings else None)
        siblings.add(key)
        return why

    def prepare(self, view: StageView, record: TrialRecord) -> tuple[TrialRecord, int]:
        """The trial with its place in the tree filled in, and its last global step.

        The root runs segment 1; a proposed branch (built by the review node) starts from the checkpoint of the
        node being expanded; records that already name their parent (static continuations, re-evaluations) keep it.
        """
        bounds = view.options.schedule_boundaries()
        update: dict[str, Any] = {}
        if record.kind == "baseline" and record.parent_trial is None:
            to = bounds[0]
        else:
            if record.parent_trial is None:
                parent = schedule_state(view.state)["expanding"]
                row = view.ledger.trial(parent) or {}
                step = int(row.get("horizon") or 0)
                update.update(parent_trial=parent, parent_step=step,
                              parent_checkpoint=checkpoint_dir(str(row.get("trial_dir")), step))
            to = next_boundary(view.options, int(update.get("parent_step") or record.parent_step or 0))
        if to < bounds[-1] and record.kind != "confirm":
            update["save_steps"] = [to]  # the next boundary's branches start here
        return (record.model_copy(update=update) if update else record), to

    def child_record(self, view: StageView, fr: Frontier, parent: Node, *, config: dict | None = None,
                     suffix: str = "static") -> TrialRecord:
        """A segment-trial from ``parent``'s checkpoint: the unchanged continuation (or ``config``), its memory
        re-projected to the horizon (``fit_memory``)."""
        step = int(parent["to_step"])
        cfg = dict(config if config is not None else parent["config"])
        if config is None:
            cfg = self.fit_memory(view, fr, parent["id"], cfg, f"the continuation of {parent['id']}")
        return TrialRecord(
            trial_id=f"sch-{view.next_seq():02d}-{suffix}", stage=STAGE, kind="candidate", config=cfg,
            parent_trial=parent["id"], parent_step=step, parent_checkpoint=checkpoint_dir(str(parent["trial_dir"]), step),
        )

    def rerun_record(self, view: StageView, fr: Frontier, leaf_id: str) -> TrialRecord:
        """A re-evaluation of a complete schedule: its last segment again from the same checkpoint, on the next
        seed not yet used for it (the k-th re-run: seed + ``CONFIRM_SEED_OFFSET`` + k - 1, id ``LEAF-s{1+k}``),
        its memory re-projected (``fit_memory``; the leaf's own peaks at the horizon count too)."""
        leaf = fr.by_id[leaf_id]
        parent = fr.by_id[leaf["parent"]]
        k = 1 + sum(1 for n in fr.nodes if n.get("confirms") == leaf_id and not n.get("superseded"))
        step = int(parent["to_step"])
        cfg = self.fit_memory(view, fr, parent["id"], dict(leaf["config"]), f"the re-evaluation of {leaf_id}",
                              also=leaf_id)
        return TrialRecord(
            trial_id=f"{leaf_id}-s{CONFIRM_SEED_OFFSET + k}", stage=STAGE, kind="confirm", config=cfg,
            parent_trial=parent["id"], parent_step=step, parent_checkpoint=checkpoint_dir(str(parent["trial_dir"]), step),
            seed=view.options.seed + CONFIRM_SEED_OFFSET + k - 1, confirms=leaf_id,
        )

    def fit_memory(self, view: StageView, fr: Frontier, path_end: str, config: dict[str, Any], what: str, *,
                   also: str | None = None) -> dict[str, Any]:
        """``config`` with its micro batches halved (``capacity.halved_micro_batches``) when the peak memory of
        the path to ``path_end`` (and of ``also``'s, when given), projected to the horizon with the growth
        measured so far (``capacity.memory_trend``, ``capacity.projected_peak``), passes the memory limit; a note
        says so. Responses lengthen as training goes on, so a continuation that fitted when its config was
        chosen may not fit later: every continuation is re-projected at its own boundary, the unchanged ones
        (launched by the stage, never proposed) included. A micro batch changes no learning."""
        limit_of = getattr(view.services, "memory_limit_gb", None)
        limit = limit_of() if callable(limit_of) else None
        if not limit:
            return config
        horizon = view.options.schedule_boundaries()[-1]
        projected = None
        for end in (path_end, also):
            if end is None:
                continue
            level, slope = memory_trend(path_records(view.ledger, fr.nodes, end))
            if level is not None:
                p = projected_peak(level, slope, horizon - int(fr.by_id[end]["to_step"] or 0))
                projected = p if projected is None else max(projected, p)
        if projected is None or projected <= limit:
            return config
        halved, moved = halved_micro_batches(self.memory_params(view), config, self.config_errors(view))
        if moved:
            fr.notes.append(f"{what}: peak memory projected {projected:.1f} GB at step {horizon} against a limit of "
                            f"{limit:.1f} GB, smaller micro batches: " + ", ".join(moved))
        return {**config, **halved}

    @staticmethod
    def memory_params(view: StageView) -> list[Any]:
        space = getattr(view.services.backend, "search_space", None)
        return [p for p in space().stage_params(STAGE) if p.memory_safe] if callable(space) else []

    @staticmethod
    def config_errors(view: StageView) -> Any:
        """The backend's errors of a full config (its own validation where it has one)."""
        backend = view.services.backend
        validate = getattr(backend, "validate_config", None)
        if callable(validate):
            return lambda cfg: list(validate(cfg))
        return lambda cfg: backend.search_space().check_constraints(cfg)

    def memory_retry(self, view: StageView, fr: Frontier) -> TrialRecord | None:
        """A segment-trial that ran out of memory, re-run once from the same checkpoint with its micro batches
        halved (the same learning: a re-evaluation stays one, on its seed), when the budget has room for it (a
        static-path segment or a re-evaluation whenever a segment-trial is left; a branch when its parent could
        still take one, ``Frontier.affordable``). The projection (``fit_memory``) can miss: a limit raised at a
        boundary lets responses grow faster than the path so far showed, and without the re-run the branch, or
        the static path every schedule is compared with, ends there. The root is stage 1's matter (its start
        config), and a re-run that runs out of memory again is not re-run."""
        if fr.used >= fr.budget:
            return None
        spine = {n["id"] for n in fr.spine}
        for n in fr.nodes:
            if n["status"] != "oom" or n.get("superseded") or n.get("retry_of") or n["parent"] not in fr.by_id:
                continue
            parent = fr.by_id[n["parent"]]
            on_spine = not n["changes"] and parent["id"] in spine
            if not (on_spine or n.get("confirms") or fr.affordable(parent) >= 1):
                continue
            halved, moved = halved_micro_batches(self.memory_params(view), n["config"], self.config_errors(view))
            if not moved:
                continue
            fr.notes.append(f"{n['id']} ran out of memory ({n.get('reason') or 'oom'}): re-run from the same "
                            "checkpoint with smaller micro batches: " + ", ".join(moved))
            step = int(parent["to_step"])
            tid = f"{n['id']}-mem" if n.get("confirms") else f"sch-{view.next_seq():02d}-mem"
            return TrialRecord(
                trial_id=tid, stage=STAGE, kind="confirm" if n.get("confirms") else "candidate",
                config={**n["config"], **halved}, parent_trial=parent["id"], parent_step=step,
                parent_checkpoint=checkpoint_dir(str(parent["trial_dir"]), step), seed=n.get("seed"),
                confirms=n.get("confirms"))
        return None

    # -- decisions --------------------------------------------------------------------------------
    def plan(self, view: StageView, free: int) -> Plan:
        """``_plan`` held to the budget: a hard cap on the segment-trials started or decided, whichever path
        decides (the baseline's re-run after a kill from outside included)."""
        plan = self._plan(view, free)
        left = view.options.schedule_trial_budget() - view.launched(STAGE)
        if len(plan.launch) <= left and plan.propose <= max(0, left):
            return plan
        capped = replace(plan, launch=plan.launch[:max(0, left)], propose=min(plan.propose, max(0, left)))
        if capped.waits and not view.running(STAGE):
            capped.done = True  # nothing in flight and no room left: the stage concludes
        return capped

    def _plan(self, view: StageView, free: int) -> Plan:
        """The next branch, the next expansion, the static path's completion, a re-evaluation, or the end."""
        first = self.baseline_plan(view)
        if first is not None:
            return first
        fr = Frontier.of(view)
        busy = bool(view.running(STAGE))
        if fr.root is None or not usable(fr.root) or view.out_of_time():
            return Plan() if busy else Plan(done=True)
        if free <= 0:
            return Plan()
        retry = self.memory_retry(view, fr)
        if retry is not None:
            return Plan(launch=[retry], update=fr.keep())
        while True:
            if fr.expanding is not None:
                plan = self._expand(view, fr, free, busy)
                if plan is not None:
                    return plan
            if busy:
                return Plan(update=fr.keep())
            # best first among the nodes whose expansion the budget still allows (deeper ones as it runs out)
            nxt = next((n for n in rank_frontier(fr.nodes, fr.depth, fr.noise, set(fr.expanded))
                        if fr.extends_spine(n["id"]) or fr.affordable(n) >= 1), None)
            if nxt is None:
                break
            fr.expanding = nxt["id"]
            fr.expanded.append(fr.expanding)
        return self._complete(view, fr, free)

    def _expand(self, view: StageView, fr: Frontier, free: int, busy: bool) -> Plan | None:
        """The next step of the expansion in progress (its unchanged continuation, proposals for more branches,
        or a wait for them), or None once it is over (``fr.expanding`` cleared)."""
        assert fr.expanding is not None
        parent = fr.by_id[fr.expanding]
        kids = children(fr.nodes, fr.expanding)
        if fr.exhausted.get(STAGE):  # the agents found nothing (more) for this checkpoint: it is done
            fr.notes.append(f"expansion of {fr.expanding} ended after {len(kids)} branches: {fr.exhausted.pop(STAGE)}")
            fr.expanding = None
            return None
        if not any(not c["changes"] for c in kids):
            if fr.extends_spine(fr.expanding) or (fr.used < fr.budget and fr.affordable(parent) >= 1):
                return Plan(launch=[self.child_record(view, fr, parent)], update=fr.keep())
        elif len(kids) < fr.branches and fr.affordable(parent) >= 1:
            if view.waiting(STAGE):
                return Plan(update=fr.keep())  # nothing new to try until a sibling finishes
            return Plan(propose=min(free, fr.branches - len(kids), fr.affordable(parent)), update=fr.keep())
        if busy:  # the expansion's branches still run: the next expansion needs their results
            return Plan(update=fr.keep())
        fr.expanding = None
        return None

    def _complete(self, view: StageView, fr: Frontier, free: int) -> Plan:
        """No expansion left: the static path to the horizon (the reference every schedule is compared with),
        then the re-evaluations, then the end."""
        if fr.spine_open and fr.used < fr.budget:
            return Plan(launch=[self.child_record(view, fr, fr.spine[-1])], update=fr.keep())
        # no complete changed schedule, and a live first-boundary branch short of the horizon (the search's share
        # ran out while its carry was reserved): carried on from the re-evaluations' share, best first - a
        # re-evaluation needs a complete changed schedule to re-run, and without one the reserve would end the
        # stage unspent (with one, the reserve re-runs it: the winner needs its second run)
        spine_ids = {n["id"] for n in fr.spine}
        if not any(usable(n) and n["depth"] == fr.depth and not n.get("confirms") and n["id"] not in spine_ids
                   for n in fr.nodes):
            for end in sorted(fr.carried(), key=lambda n: -n["score"]):
                if end["depth"] < fr.depth and fr.used < fr.budget \
                        and not any(not c["changes"] for c in children(fr.nodes, end["id"])):
                    return Plan(launch=[self.child_record(view, fr, end)], update=fr.keep())
        if fr.used >= fr.budget:
            return Plan(done=True, update=fr.keep())
        # a claim one more run can settle comes before the other close schedules' re-runs: without it the
        # static schedule is kept on an interval that nearly excludes zero (docs/runtime.md, "Re-evaluations")
        settle = deciding_rerun(fr.nodes, fr.depth, fr.noise)
        if settle is not None:
            return Plan(launch=[self.rerun_record(view, fr, settle)], update=fr.keep())
        rerun = {n.get("confirms") for n in fr.nodes if n.get("confirms")}
        todo = [leaf for leaf in recheck_plan(fr.nodes, fr.depth, fr.noise) if leaf not in rerun]
        rechecks = [self.rerun_record(view, fr, leaf) for leaf in todo[:min(free, fr.budget - fr.used)]]
        if rechecks:
            return Plan(launch=rechecks, update=fr.keep())
        return Plan(done=True, update=fr.keep())

    def collected(self, view: StageView, record: TrialRecord, eligible: bool) -> dict[str, Any]:
        # a branch is a node of the tree, whose winner is a complete path (``conclude``); only the root counts here
        return super().collected(view, record, eligible) if record.kind == "baseline" else {}

    def compared_to(self, view: StageView, record: TrialRecord) -> tuple[float | None, str]:
        """A branch against the unchanged continuation from the same checkpoint."""
        if not record.parent_trial:
            return None, "unchanged"
        same = [r for r in view.ledger.trials(STAGE) if r.get("parent_trial") == record.parent_trial
                and not r.get("overrides") and not r.get("confirms") and r["trial_id"] != record.trial_id]
        return (same[0].get("score") if same else None), "unchanged"

    def conclude(self, view: StageView, note: str | None) -> tuple[dict[str, Any], str | None]:
        """The winning complete schedule, its segments and the tree; ``note``: why the stage ended early."""
        state, options = view.state, view.options
        depth = len(options.schedule_boundaries())
        sched = schedule_state(state)
        nodes, noise = tree_nodes(view.services, prior_noise=((state.get("selection") or {}).get("learning")
                                                              or {}).get("noise"))
        notes = list(sched["notes"])
        root = next((n for n in nodes if n["parent"] is None and not n["confirms"]), None)
        if root is None or not usable(root):
            why = "no root segment" if root is None else f"the root segment {root['id']} ended {root['status']}" + (
                f" ({root['reason']})" if root.get("reason") else "")
            notes.append(f"{why}: no schedule")
        elif note:
            notes.append(note)
        winner, ranked = pick_schedule_winner(nodes, depth, noise) if nodes else (None, [])
        static = next((c for c in ranked if c.is_baseline), None)
        if winner is not None and winner is static:  # the static schedule kept: say why, as stage 2 does
            verdict = baseline_verdict(ranked, noise, baseline="the static schedule")
            if verdict and not verdict.startswith("no change"):
                notes.append(f"the static schedule is kept: {verdict}")
        leader = winner if winner is not None and winner is not static else next(
            (c for c in ranked if not c.is_baseline), None)
        interval = schedule_gain_interval(static, leader, noise) if static is not None and leader is not None else None
        if interval is not None and leader is not None and winner is static:
            notes.append(f"the best schedule {leader.key} against the static one: {interval.describe()}"
                         + ("" if interval.confirms_gain else ": its interval does not exclude zero"))
        result = _result(options, nodes, noise, static, notes)
        result["gain_interval"] = interval.to_json() if interval is not None else None
        update: dict[str, Any] = {}
        if winner is not None:
            update = self._crown(view, nodes, winner, static, result)
        elif not any(usable(n) and n["depth"] == depth for n in nodes):
            result["notes"].append("no complete schedule reached the horizon")
        view.ledger.set_stage_result(
            view.services.run_id, STAGE, baseline_trial=static.key if static else None,
            best_trial=winner.key if winner else None, baseline_value=static.mean if static else None,
            best_value=winner.mean if winner else None, best_config={"segments": result["segments"]},
            note="; ".join(result["notes"]))
        update["schedule"] = {**sched, "expanding": None, "notes": notes, "result": result}
        update["exhausted"] = {k: v for k, v in (state.get("exhausted") or {}).items() if k != STAGE}
        return update, None

    def _crown(self, view: StageView, nodes: list[Node], winner: Any, static: Any, result: dict[str, Any]
               ) -> dict[str, Any]:
        """The winner's segments and figures into ``result``; the state update naming it the stage's best."""
        base = LearningStage().base_config(view)
        path = path_to(nodes, winner.key)
        result["segments"] = [
            {"from_step": n["from_step"], "to_step": n["to_step"],
             "overrides": {k: v for k, v in n["config"].items() if base.get(k, object()) != v},
             "changes": {**n["changes"], **n.get("memory_moves", {})}, "trial_id": n["id"]} for n in path]
        result.update(final_score=_round(winner.mean), final_score_spread=_round(winner.spread),
                      final_score_runs=len(winner.scores), winner=winner.key,
                      gpu_hours=_round(path_gpu_hours(nodes, winner.key)))
        if static is not None:
            result["gain"] = _round(winner.mean - static.mean)
        leaf = {n["id"]: n for n in nodes}[winner.key]
        rec = TrialRecord(trial_id=leaf["id"], stage=STAGE, kind=leaf["kind"] or "candidate",
                          candidate_id=leaf.get("candidate_id"), status=leaf["status"],
                          score=leaf["score"], steps_done=leaf["to_step"] or 0, parent_trial=leaf["parent"])
        state = view.state
        return {"best": {**(state.get("best") or {}), STAGE: rec},
                "best_overrides": {**(state.get("best_overrides") or {}), STAGE: result["segments"][-1]["overrides"]}}

    # -- what people see --------------------------------------------------------------------------
    def review_context(self, view: StageView) -> dict[str, Any]:
        """The checkpoint a branch starts from and the segment it trains (for the reviewer)."""
        parent = schedule_state(view.state)["expanding"]
        row = view.ledger.trial(parent) if parent else None
        if row is None:
            return {}
        step = int(row.get("horizon") or 0)
        nxt = next((b for b in view.options.schedule_boundaries() if b > step), step)
        return {"parent_trial": parent, "segment": [step, nxt]}

    def summary(self, state: Mapping[str, Any], services: Any) -> tuple[dict[str, Any], list[str]]:
        result = (state.get("schedule") or {}).get("result")
        if result is not None:
            return {"schedule": schedule_summary(result)}, [f"schedule stage: {n}" for n in result.get("notes", [])]
        exhausted = (state.get("exhausted") or {}).get(STAGE)
        return {}, ([f"schedule stage: {exhausted}"] if exhausted and services.options.runs_stage(STAGE) else [])
