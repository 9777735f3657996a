"""Stage 3's promises that hold the tree search honest (issue 28): the healthier node wins a tie before the
shallower one, re-checks are planned on first runs (a resumed session plans the same ones), and the static path
reaches the horizon however tight the budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.state.schedule import rank_frontier, recheck_plan, static_path, usable


def node(id, parent, depth, score, *, changes=None, signals=(), confirms=None):
    return {"id": id, "parent": parent, "depth": depth, "score": score, "status": "completed", "early_stopped": False,
            "changes": changes if changes is not None else ({} if parent is None else {"lr": depth}),
            "signals": list(signals), "confirms": confirms}


def test_within_the_noise_the_healthy_node_is_expanded_before_the_shallower_sick_one():
    nodes = [node("root", None, 1, 0.50),
             node("sick", "root", 1, 0.52, changes={"lr": 2}, signals=["entropy 0.01 < 0.15 x early 0.9"]),
             node("deep", "root", 2, 0.515, changes={"lr": 3})]
    ranked = [n["id"] for n in rank_frontier(nodes, depth=3, noise=0.01, expanded={"root"})]
    assert ranked[0] == "deep", ranked  # tied scores: health first, depth only among the healthy


def test_rechecks_are_planned_on_first_runs_so_a_rerun_changes_nothing_already_planned():
    leaves = [node("root", None, 1, 0.5, changes={}), node("s2", "root", 2, 0.5, changes={}),
              node("static", "s2", 3, 0.50, changes={}),
              node("a", "s2", 3, 0.53), node("b", "s2", 3, 0.525, changes={"lr": 9})]
    before = recheck_plan(leaves, depth=3, noise=0.01)
    assert before[:1] == ["a"] and "b" in before
    # a's re-run comes in low: judged on all runs, b would lead and the plan would change under a resumed session
    after = recheck_plan(leaves + [node("a-s2", "s2", 3, 0.45, confirms="a")], depth=3, noise=0.01)
    assert after == before


def test_the_static_path_reaches_the_horizon_even_when_the_budget_is_tight(tmp_path):
    # S=3 segments, K=3 branches, a budget of 6: one expansion down a changed path, and the static path beside it
    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "poll", "seed": 2},
                       approve="auto", stages=["schedule"], learning_horizon=12, schedule_segments=3,
                       schedule_branches=3, schedule_budget=6, watch_interval_s=0.001, quiet=True, report=False,
                       runs_dir=str(tmp_path))
    summary = tune(opts)
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    bounds = opts.schedule_boundaries()
    nodes = [{"id": r["trial_id"], "parent": r["parent_trial"], "depth": bounds.index(r["horizon"]) + 1,
              "score": r["score"], "status": r["status"], "early_stopped": r["early_stopped"],
              "changes": r["overrides"] or {}, "confirms": r["confirms"]} for r in ledger.trials("schedule")]
    spine = static_path(nodes)
    assert len(nodes) <= 6
    assert spine[-1]["depth"] == 3 and all(usable(n) for n in spine), [(n["id"], n["depth"]) for n in spine]
    assert summary["schedule"]["static_best_score"] is not None
    ledger.close()


# --- issue 44: a schedule is claimed only when its interval says so ------------------------------------------------
def _leaves(schedule_scores, static_scores=(0.50,)):
    """A complete static path and one changed complete schedule at depth 2, with re-runs (``confirms``) after the
    first score of each."""
    nodes = [node("root", None, 1, 0.5, changes={}), node("static", "root", 2, static_scores[0], changes={}),
             node("sched", "root", 2, schedule_scores[0], changes={"lr": 2})]
    nodes += [node(f"static-s{i}", "root", 2, s, changes={}, confirms="static") for i, s in enumerate(static_scores[1:])]
    nodes += [node(f"sched-s{i}", "root", 2, s, changes={"lr": 2}, confirms="sched")
              for i, s in enumerate(schedule_scores[1:])]
    return nodes


def test_a_schedule_replaces_the_static_one_only_when_its_gain_interval_excludes_zero():
    from mart.state.schedule import leaf_contenders, pick_schedule_winner, schedule_gain_interval

    # noise 0.01: two runs at +0.04 against one static run clear the 90% interval (half-width 1.645 x 0.0122)
    winner, _ = pick_schedule_winner(_leaves((0.54, 0.54)), depth=2, noise=0.01)
    assert winner is not None and winner.key == "sched"
    # the same lead on one run is never claimed; a lead inside the interval neither
    assert pick_schedule_winner(_leaves((0.54,)), depth=2, noise=0.01)[0].key == "static"
    assert pick_schedule_winner(_leaves((0.515, 0.515)), depth=2, noise=0.01)[0].key == "static"
    # a re-run below the static mean sinks it whatever the mean
    assert pick_schedule_winner(_leaves((0.60, 0.49)), depth=2, noise=0.01)[0].key == "static"
    static, sched = sorted(leaf_contenders(_leaves((0.54, 0.54)), 2), key=lambda c: not c.is_baseline)
    iv = schedule_gain_interval(static, sched, 0.01)
    assert iv.method == "known-noise-t" and iv.confirms_gain and iv.estimate == pytest.approx(0.04)
    assert iv.lo == pytest.approx(0.04 - 1.6449 * 0.01 * (1.5 ** 0.5), abs=1e-4)


def _frontier(nodes, depth=4, k=3, budget=12, noise=0.01):
    from mart.nodes.stages.schedule import Frontier, search_budget

    root = next(n for n in nodes if n["parent"] is None)
    spine = static_path(nodes)
    open_ = spine[-1]["depth"] < depth
    return Frontier(sched={}, nodes=nodes, noise=noise, depth=depth, branches=k, budget=budget, used=len(nodes),
                    expanding=None, expanded=[], notes=[], exhausted={}, root=root, by_id={n["id"]: n for n in nodes},
                    spine=spine, spine_open=open_, spine_missing=depth - spine[-1]["depth"] if open_ else 0,
                    search_budget=search_budget(budget, depth, k))


def test_the_default_budget_keeps_room_for_the_re_evaluations_a_claimed_schedule_needs():
    from mart.nodes.stages.schedule import RECHECK_RUNS, search_budget

    assert search_budget(12, 4, 3) == 12 - RECHECK_RUNS  # S=4, K=3: the default budget S x K
    assert search_budget(9, 4, 3) == 9  # too tight for the root's expansion and two paths plus the re-runs


def test_first_boundary_branches_tied_with_the_best_are_carried_to_the_horizon_not_dropped_on_one_point():
    nodes = [node("root", None, 1, 0.50, changes={}), node("s2", "root", 2, 0.52, changes={}),
             node("a", "root", 2, 0.53, changes={"lr": 2}), node("b", "root", 2, 0.515, changes={"lr": 3}),
             node("far", "root", 2, 0.45, changes={"lr": 4})]
    fr = _frontier(nodes)
    assert sorted(n["id"] for n in fr.carried()) == ["a", "b"]  # "far" is beyond the noise, s2 is the static path
    # expanding "a": its own path is its own, "b" still needs its two continuations, the static path its two
    assert fr.carry_reserve(nodes[2]) == 2
    assert fr.affordable(nodes[2]) == 10 - 5 - 1 - 2 - 2
    # once b's continuation ran, only the segment after it is still owed
    nodes.append(node("b3", "b", 3, 0.54, changes={}))
    assert _frontier(nodes).carry_reserve(nodes[2]) == 1
