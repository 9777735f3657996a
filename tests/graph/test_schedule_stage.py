"""The schedule stage (stage 3) end to end on the simulator (poll clock: no waiting), and its tree rules.

What must hold: the root runs segment 1 and saves a checkpoint; every branch starts from its parent's checkpoint
at the parent's last step and ends at the next boundary (the ledger's parent columns form the tree); each
expanded node has the unchanged continuation among its branches; the segment-trial budget is respected; the
summary's schedule chains segment to segment up to the horizon and compares it with the static path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.models import ReviewDecision
from mart.state.options import TuneOptions
from mart.state.schedule import path_to, pick_expansion, static_path
from mart.state.trials import checkpoint_dir
from tests.graph.test_graph_session import Scripted
from tests.support.oracles import assert_readme_shape


def sim_options(tmp_path, **kw) -> TuneOptions:
    base = dict(backend="sim", backend_options={"clock": "poll", "steps_per_poll": 5}, approve="auto",
                runs_dir=str(tmp_path), stages=["schedule"], learning_horizon=12, schedule_segments=3,
                schedule_branches=3, watch_interval_s=0.01, quiet=True, report=False)
    base.update(kw)
    return TuneOptions(**base)


def check_tree(rows: list[dict], options: TuneOptions) -> None:
    """The ledger's schedule rows form a tree of segments chained at the boundaries."""
    bounds = options.schedule_boundaries()
    by_id = {r["trial_id"]: r for r in rows}
    roots = [r for r in rows if r["parent_trial"] is None]
    assert len(roots) == 1 and roots[0]["horizon"] == bounds[0] and roots[0]["kind"] == "baseline"
    for r in rows:
        if r["parent_trial"] is None:
            continue
        parent = by_id[r["parent_trial"]]  # a parent is itself a schedule trial of this run
        assert r["parent_step"] == parent["horizon"], r["trial_id"]  # starts where its parent ended
        assert r["parent_checkpoint"] == checkpoint_dir(parent["trial_dir"], parent["horizon"])
        assert Path(r["parent_checkpoint"]).is_dir(), "the parent saved the checkpoint the branch started from"
        assert r["horizon"] == bounds[bounds.index(parent["horizon"]) + 1]  # ends at the next boundary


def test_schedule_session_on_the_sim_grows_a_tree_within_budget(tmp_path):
    opts = sim_options(tmp_path)
    summary = tune(opts)
    assert_readme_shape(summary)
    assert summary["status"] == "completed"
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    rows = ledger.trials("schedule")
    assert [r["stage"] for r in ledger.trials()] == ["schedule"] * len(rows), "stages system/learning did not run"
    check_tree(rows, opts)
    assert len(rows) <= opts.schedule_trial_budget() == 9
    # every node that got branches has the unchanged continuation among them, first
    kids: dict[str, list[dict]] = {}
    for r in rows:
        if r["parent_trial"] and not r["confirms"]:
            kids.setdefault(r["parent_trial"], []).append(r)
    assert kids, "no branch ran"
    for parent, ks in kids.items():
        assert ks[0]["overrides"] == {} and ks[0]["config"] == ledger.trial(parent)["config"], parent
        assert len(ks) <= opts.schedule_branches
        assert len({str(sorted(k["overrides"].items())) for k in ks}) == len(ks), "a branch ran twice"
    changed = [r for r in rows if r["overrides"] and not r["confirms"]]
    assert changed and all(r["candidate_id"] for r in changed), "transitions come from reviewed proposals"
    # the summary's schedule: segments chained from 0 to T, along a path of the tree
    sched = summary["schedule"]
    segs = sched["segments"]
    assert [s["from_step"] for s in segs] == [0, *opts.schedule_boundaries()[:-1]]
    assert [s["to_step"] for s in segs] == opts.schedule_boundaries()
    assert [n["id"] for n in path_to(_nodes(rows), sched["winner"])] == [s["trial_id"] for s in segs]
    assert sched["branches_run"] == len(rows) and sched["budget"] == 9
    assert len(sched["tree"]) == len(rows)
    # the static config to the horizon is always run: it is the reference
    static = static_path(_nodes(rows))
    assert len(static) == 3
    scores = [static[-1]["score"]] + [r["score"] for r in rows if r["confirms"] == static[-1]["id"]]
    assert sched["static_best_score"] == pytest.approx(sum(scores) / len(scores), abs=1e-6)
    assert sched["gain"] == pytest.approx(sched["final_score"] - sched["static_best_score"], abs=1e-5)
    # each segment's overrides are its full learning config against the base; a segment's changes its diff
    for a, b in zip(segs, segs[1:]):
        assert {**a["overrides"], **b["changes"]}.items() >= b["overrides"].items()


def _nodes(rows: list[dict]) -> list[dict]:
    return [{"id": r["trial_id"], "parent": r["parent_trial"], "confirms": r["confirms"], "changes": r["overrides"],
             "depth": 0, "score": r["score"]} for r in rows]


def test_review_rejection_in_the_schedule_stage_re_proposes_with_the_feedback(tmp_path):
    reviewer = Scripted([ReviewDecision(action="reject", feedback="keep the temperature", reviewer="t", channel="t")])
    summary = tune(sim_options(tmp_path, approve="none", schedule_budget=4), reviewer=reviewer)
    assert summary["status"] == "completed"
    first, second = reviewer.requests[0], reviewer.requests[1]
    assert first["stage"] == second["stage"] == "schedule"
    assert first["segment"] == second["segment"] == [4, 8] and first["parent_trial"] == second["parent_trial"]
    assert first["candidate_id"] != second["candidate_id"]
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    [review] = [r for r in ledger.table_rows("reviews") if r["action"] == "reject"]
    assert review["feedback"] == "keep the temperature"
    rows = ledger.trials("schedule")
    rejected = first["candidate_id"]
    assert rejected not in {r["candidate_id"] for r in rows}, "a rejected transition never runs"
    assert len(rows) <= 4


def test_pick_expansion_prefers_healthy_then_shallower_within_noise():
    nodes = [
        {"id": "a", "depth": 1, "score": 0.50, "status": "completed", "signals": []},
        {"id": "b", "depth": 2, "score": 0.51, "status": "completed", "signals": ["health: entropy_collapse"]},
        {"id": "c", "depth": 2, "score": 0.505, "status": "completed", "signals": []},
        {"id": "d", "depth": 3, "score": 0.90, "status": "completed", "signals": []},  # final depth: a leaf
        {"id": "e", "depth": 2, "score": 0.70, "status": "stopped", "signals": []},  # stopped: a dead end
    ]
    # within the noise: the collapsing one never wins over a healthy close one; the shallower wins the tie
    assert pick_expansion(nodes, 3, noise=0.01, expanded=set())["id"] == "a"
    assert pick_expansion(nodes, 3, noise=0.01, expanded={"a"})["id"] == "c"
    # a clear lead (beyond the noise) wins
    assert pick_expansion(nodes, 3, noise=0.001, expanded=set())["id"] == "b"
    assert pick_expansion(nodes, 3, noise=0.01, expanded={"a", "b", "c"}) is None
