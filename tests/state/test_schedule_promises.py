"""Stage 3's promises that hold the tree search honest (issue 28): the healthier node wins a tie before the
shallower one, re-checks are planned on first runs (a resumed session plans the same ones), and the static path
reaches the horizon however tight the budget."""

from __future__ import annotations

from pathlib import Path

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
