"""The schedule stage's tree, as pure functions of its nodes (one node = one segment-trial).

A node is a small dict built from the ledger (``nodes/stages/schedule.py``): ``id``, ``parent`` (None for the
root), ``depth`` (1 = the first segment), ``from_step``/``to_step`` (global steps), ``changes`` (the knobs
it changed against its parent's config, its micro batches aside in ``memory_moves``; ``{}`` = the unchanged
continuation), ``status``, ``score`` (its last validation, at ``to_step``), ``signals`` (collapse signals of its
path), ``superseded`` (it ran out of memory and was re-run with smaller micro batches, ``retry_of`` on the
re-run) and ``static`` (on the all-unchanged path from the root: the static config is a schedule too, and the
reference a schedule must beat).

The search is best-first (LLMZero, arXiv 2606.18388, searches training trajectories by tree search from
checkpoints): the next node to expand is the best finished node not at the final depth, by validation score,
where scores within the measured noise are treated as ties (the healthier, then the shallower, wins), and a
node with collapse signals is never expanded over a healthy one with a close score.
"""

from __future__ import annotations

import math
from typing import Any

from mart.state.objectives import Z_LEAD, Contender, learning_choice, pick_learning_winner
from mart.state.stats import Interval, difference_interval, noise_difference_interval

Node = dict[str, Any]

#: scores closer than this many noise-of-a-difference units are ties (stage 2's "too close to call")
TIE_Z = Z_LEAD


def usable(node: Node) -> bool:
    """A node that finished healthy enough to be scored (a stopped, failed or unscored one is a dead end)."""
    return node.get("status") == "completed" and not node.get("early_stopped") and node.get("score") is not None


def children(nodes: list[Node], node_id: str) -> list[Node]:
    """The branches from ``node_id``'s checkpoint (re-evaluations and segments re-run for memory left out: a
    ``superseded`` node ran out of memory and its re-run with smaller micro batches takes its place)."""
    return [n for n in nodes if n.get("parent") == node_id and not n.get("confirms") and not n.get("superseded")]


def path_to(nodes: list[Node], node_id: str) -> list[Node]:
    """The nodes from the root to ``node_id`` (inclusive)."""
    by_id = {n["id"]: n for n in nodes}
    out: list[Node] = []
    cur = by_id.get(node_id)
    while cur is not None:
        out.append(cur)
        cur = by_id.get(cur.get("parent")) if cur.get("parent") else None
    return out[::-1]


def static_path(nodes: list[Node]) -> list[Node]:
    """The root and its chain of unchanged continuations (the static config's own trajectory)."""
    tree = [n for n in nodes if not n.get("confirms")]
    root = next((n for n in tree if n.get("parent") is None), None)
    out = []
    while root is not None:
        out.append(root)
        root = next((c for c in children(tree, root["id"]) if not c.get("changes")), None)
    return out


def rank_frontier(nodes: list[Node], depth: int, noise: float, expanded: set[str]) -> list[Node]:
    """The usable nodes above the final ``depth`` not yet expanded, best first.

    Scores within ``TIE_Z`` x the noise of a difference of the best one are ties; among ties a node without
    collapse signals comes first, then the shallower one (fewer steps on the same score is the better
    trajectory), then the higher score; the nodes beyond the tie follow by score, healthy ones first.
    """
    frontier = [n for n in nodes if usable(n) and not n.get("confirms") and n["depth"] < depth
                and n["id"] not in expanded]
    if not frontier:
        return []
    top = max(n["score"] for n in frontier)
    tie = TIE_Z * noise * math.sqrt(2)

    def key(n: Node) -> tuple:
        if top - n["score"] <= tie:
            return (0, bool(n.get("signals")), n["depth"], -n["score"], n["id"])
        return (1, bool(n.get("signals")), 0, -n["score"], n["id"])

    return sorted(frontier, key=key)


def pick_expansion(nodes: list[Node], depth: int, noise: float, expanded: set[str]) -> Node | None:
    """The next node to expand (``rank_frontier``'s first), or None."""
    ranked = rank_frontier(nodes, depth, noise, expanded)
    return ranked[0] if ranked else None


def leaf_contenders(nodes: list[Node], depth: int) -> list[Contender]:
    """Complete schedules (usable leaves at the final depth) as contenders; a leaf's re-evaluations (nodes
    with ``confirms``) add their scores, or count against it when they failed. The static leaf is the
    baseline."""
    static = static_path(nodes)
    static_leaf = static[-1]["id"] if static and static[-1]["depth"] == depth else None
    out = []
    for leaf in nodes:
        if leaf.get("confirms") or leaf["depth"] != depth or not usable(leaf):
            continue
        reruns = [n for n in nodes if n.get("confirms") == leaf["id"] and not n.get("superseded")]
        scores = [leaf["score"]] + [n["score"] for n in reruns if usable(n)]
        signals = list(leaf.get("signals") or [])
        signals += [f"re-evaluation {n['id']} ended {n.get('status')}" for n in reruns if not usable(n)]
        c = Contender(key=leaf["id"], scores=scores, signals=signals, is_baseline=leaf["id"] == static_leaf)
        c.first_signals = list(leaf.get("signals") or [])
        out.append(c)
    return out


def recheck_plan(nodes: list[Node], depth: int, noise: float) -> list[str]:
    """Leaves to re-evaluate before a winner is named, as stage 2 does: the leader when it is not the static
    schedule, and every healthy leaf too close to it to call (judged on the first runs only, so a resumed
    session plans the same re-evaluations)."""
    firsts = [Contender(c.key, c.scores[:1], c.first_signals, c.is_baseline) for c in leaf_contenders(nodes, depth)]
    if not firsts:
        return []
    leader, close = pick_learning_winner(firsts, noise)
    plan = [] if leader.is_baseline and not close else [leader]
    plan += [c for c in close if not c.signals or c.is_baseline]
    return [c.key for c in plan]


def deciding_rerun(nodes: list[Node], depth: int, noise: float) -> str | None:
    """The leaf whose next run could settle an ambiguous claim, or None.

    The claim is the best healthy changed schedule already run twice or more (only such a schedule can replace
    the static one) against the static schedule. It is ambiguous when its gain interval
    (``schedule_gain_interval``) straddles zero with the estimate above it: the gain looks real and the evidence
    cannot yet say so. One more run narrows the interval most on the side with fewer runs (the static one on
    equal runs: it is the reference of every schedule's interval, so its run narrows them all); that side is
    re-run only when, at the current estimate, the narrower interval would exclude zero. A claim that one
    run cannot settle leaves the budget to the re-evaluations of the other close schedules."""
    contenders = leaf_contenders(nodes, depth)
    static = next((c for c in contenders if c.is_baseline), None)
    claims = [c for c in contenders if not c.is_baseline and len(c.scores) >= 2 and not c.signals]
    if static is None or not claims or not noise or noise <= 0:
        return None
    best = max(claims, key=lambda c: c.mean)
    now = schedule_gain_interval(static, best, noise)
    if now.confirms_gain or now.estimate <= 0:
        return None
    side = static if len(static.scores) <= len(best.scores) else best
    # the same means with one more run on ``side``: the interval that run would give if it met the estimate
    more = [Contender(c.key, c.scores + [c.mean] * (c is side), [], c.is_baseline) for c in (static, best)]
    return side.key if schedule_gain_interval(more[0], more[1], noise).confirms_gain else None


def schedule_gain_interval(static: Contender, c: Contender, noise: float) -> Interval:
    """A complete schedule's final score minus the static schedule's, with its interval (``stats.LEVEL``): the
    spread is the measured noise of one validation score (``noise``, from the tree's validation curves) over the
    runs of each side; without a noise, the runs' own spread (``stats.difference_interval``)."""
    if noise and noise > 0:
        return noise_difference_interval(static.scores, c.scores, noise)
    return difference_interval(static.scores, c.scores)


def pick_schedule_winner(nodes: list[Node], depth: int, noise: float) -> tuple[Contender | None, list[Contender]]:
    """The winning complete schedule and all contenders ranked by mean. A schedule replaces the static one only
    when its gain interval over it (``schedule_gain_interval``) lies above zero, it ran on two seeds (a re-evaluation of its
    last segment), its re-run alone beats the static schedule's mean, and no run of it showed a collapse signal;
    among those, the best mean. A gain seen on one run is never claimed. Without a complete static schedule,
    stage 2's rule over the rest (``objectives.learning_choice``)."""
    contenders = leaf_contenders(nodes, depth)
    if not contenders:
        return None, []
    ranked = sorted(contenders, key=lambda c: -c.mean)
    static = next((c for c in contenders if c.is_baseline), None)
    if static is None:
        winner, _ = learning_choice(contenders, noise)
        return winner, ranked
    proven = [c for c in ranked if not c.is_baseline and len(c.scores) >= 2 and not c.signals
              and all(x > static.mean for x in c.scores[1:]) and schedule_gain_interval(static, c, noise).confirms_gain]
    return (proven[0] if proven else static), ranked


# --- GPU-hours: what a schedule costs beside what it scores ----------------------------------------------------------
#: verl's timing keys of one step's work and of a validation pass (the metric stream every backend writes)
STEP_TIMING, TEST_TIMING = "timing_s/step", "timing_s/testing"


def gpu_count(config: dict[str, Any]) -> int:
    """GPUs a trial of ``config`` holds (verl's ``trainer.n_gpus_per_node`` x ``trainer.nnodes``; 1 when unset)."""
    def num(key: str) -> int:
        try:
            return max(1, int(config.get(key) or 1))
        except (TypeError, ValueError):
            return 1

    return num("trainer.n_gpus_per_node") * num("trainer.nnodes")


def gpu_hours(records: list[Any], config: dict[str, Any]) -> float | None:
    """GPU-hours of one trial's own training and validation: the sum of its steps' ``timing_s/step`` and
    ``timing_s/testing`` x its GPUs (start-up excluded: it does not depend on the knobs a schedule moves). None
    without any timing (a backend that reports none)."""
    seconds, seen = 0.0, False
    for r in records:
        data = getattr(r, "data", r)
        for key in (STEP_TIMING, TEST_TIMING):
            v = data.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                seconds += float(v)
                seen = True
    return seconds * gpu_count(config) / 3600.0 if seen else None


def path_gpu_hours(nodes: list[Node], node_id: str) -> float | None:
    """GPU-hours of the schedule ending at ``node_id``: its segments' (``gpu_hours`` of each node on the path),
    None when one of them is unknown."""
    total = 0.0
    for n in path_to(nodes, node_id):
        h = n.get("gpu_hours")
        if h is None:
            return None
        total += float(h)
    return total


def search_gpu_hours(nodes: list[Node]) -> float | None:
    """GPU-hours every segment-trial of the search used, re-evaluations included (a trial without timings, e.g.
    one that failed at start, counts 0; None when no trial has any)."""
    known = [float(n["gpu_hours"]) for n in nodes if n.get("gpu_hours") is not None]
    return sum(known) if known else None
