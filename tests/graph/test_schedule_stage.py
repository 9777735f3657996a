"""The schedule stage (stage 3) end to end on the simulator (poll clock: no waiting), and its tree rules.

What must hold: the root runs segment 1 and saves a checkpoint; every branch starts from its parent's checkpoint
at the parent's last step and ends at the next boundary (the ledger's parent columns form the tree); each
expanded node has the unchanged continuation among its branches; the segment-trial budget is respected; the
summary's schedule chains segment to segment up to the horizon and compares it with the static path.
"""

from __future__ import annotations

import json
import re
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
from tests.support.reviews import only


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
    # its cost beside its score: GPU-hours of one run along the winner's path, the static path's, the search's,
    # read back from the trials' own metric files (verl's file-logger lines)
    def hours(trial_id: str) -> float:
        row = ledger.trial(trial_id)
        cfg = row["config"]
        secs = 0.0
        for line in (Path(row["trial_dir"]) / "metrics.jsonl").read_text().splitlines():
            data = json.loads(line)["data"]
            secs += data.get("timing_s/step", 0.0) + data.get("timing_s/testing", 0.0)
        return secs * cfg["trainer.n_gpus_per_node"] * cfg["trainer.nnodes"] / 3600
    assert sched["gpu_hours"] == pytest.approx(sum(hours(s["trial_id"]) for s in segs), rel=1e-5)
    assert sched["static_gpu_hours"] == pytest.approx(sum(hours(n["id"]) for n in static), rel=1e-5)
    assert sched["search_gpu_hours"] == pytest.approx(sum(hours(r["trial_id"]) for r in rows), rel=1e-5)
    assert sched["gpu_hours"] > 0 and sched["search_gpu_hours"] > sched["static_gpu_hours"]


def _nodes(rows: list[dict]) -> list[dict]:
    return [{"id": r["trial_id"], "parent": r["parent_trial"], "confirms": r["confirms"], "changes": r["overrides"],
             "depth": 0, "score": r["score"]} for r in rows]


def test_review_rejection_in_the_schedule_stage_re_proposes_with_the_feedback(tmp_path):
    lr = "actor_rollout_ref.actor.optim.lr"
    reviewer = Scripted([ReviewDecision(action="reject", feedback="keep the temperature", reviewer="t", channel="t"),
                         ReviewDecision(action="edit", edits={"lr": 7e-7}, reviewer="t", channel="t")])
    summary = tune(sim_options(tmp_path, approve="none", schedule_budget=5), reviewer=reviewer)
    assert summary["status"] == "completed"
    first, second = reviewer.requests[0], reviewer.requests[1]
    assert first["stage"] == second["stage"] == "schedule"
    assert first["segment"] == second["segment"] == [4, 8] and first["parent_trial"] == second["parent_trial"]
    first, second = only(first), only(second)
    assert first["candidate_id"] != second["candidate_id"]
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    [review] = [r for r in ledger.table_rows("reviews") if r["action"] == "reject"]
    assert review["feedback"] == "keep the temperature"
    rows = ledger.trials("schedule")
    rejected = first["candidate_id"]
    assert rejected not in {r["candidate_id"] for r in rows}, "a rejected transition never runs"
    assert len(rows) <= 5
    # the edit (a learning knob, by its short name) applies to the branch, on top of its parent's config
    [edited] = [r for r in rows if r["candidate_id"] == second["candidate_id"]]
    assert edited["config"][lr] == 7e-7 and edited["overrides"][lr] == 7e-7
    parent = ledger.trial(edited["parent_trial"])["config"]
    assert {k: v for k, v in edited["config"].items() if parent.get(k) != v} == edited["overrides"]


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


@pytest.mark.slow  # ~50 s on 2 loaded cores: 5 real GRPO trials
@pytest.mark.timeout(600)
def test_three_stages_on_the_local_workload(tmp_path, local_tiny_config):
    from mart.trial_runner.local.backend import LocalBackend

    opts = TuneOptions(backend="local", approve="auto", runs_dir=str(tmp_path), stages=["system", "learning", "schedule"],
                       start_overrides=local_tiny_config, system_trials=2, learning_trials=1,
                       learning_confirm_trials=0, system_horizon=3, learning_horizon=6, schedule_segments=2,
                       schedule_branches=2, schedule_budget=3, watch_interval_s=0.1, quiet=True, report=False)
    summary = tune(opts)
    assert summary["status"] == "completed"
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    trials = ledger.trials()
    # the stages in order; stage 1's 2 search trials (its re-measurement or a disturbed repeat, kind `confirm`, on top)
    assert [t["stage"] for t in trials] == sorted((t["stage"] for t in trials), key=["system", "learning", "schedule"].index)
    assert [t["stage"] for t in trials if t["kind"] != "confirm"] == ["system"] * 2 + ["learning"] + ["schedule"] * 3
    rows = ledger.trials("schedule")
    check_tree(rows, opts)
    # the schedule starts from the base config with --set values, stage 1's and stage 2's winners
    start = {**LocalBackend().base_config(), **local_tiny_config, **summary["system"]["best_config"],
             **summary["learning"]["best_config"]}
    assert rows[0]["config"] == start
    # a branch starts from its parent's weights: its validation at the branch point is the parent's there
    val = next(k for k in ledger.metric_records(rows[0]["trial_id"])[-1].data if k.startswith("val-core/"))
    at = {r["trial_id"]: {rec.step: rec.data for rec in ledger.metric_records(r["trial_id"])} for r in rows}
    for r in rows[1:]:
        assert at[r["trial_id"]][3][val] == pytest.approx(at[rows[0]["trial_id"]][3][val], abs=1e-12)
        assert max(at[r["trial_id"]]) == 6
    sched = summary["schedule"]
    assert [(s["from_step"], s["to_step"]) for s in sched["segments"]] == [(0, 3), (3, 6)]
    assert sched["static_best_score"] == pytest.approx(rows[1]["score"]) and rows[1]["overrides"] == {}


def test_schedule_is_stored_reported_and_exportable(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from mart.graph.cli import app
    from mart.graph.report import write_report

    summary = tune(sim_options(tmp_path, schedule_budget=5))
    run_dir = Path(tmp_path) / summary["run_id"]
    segs = summary["schedule"]["segments"]
    stored = yaml.safe_load((run_dir / "schedule.yaml").read_text())
    assert [(s["from_step"], s["to_step"], s["overrides"]) for s in stored["segments"]] == \
        [(s["from_step"], s["to_step"], s["overrides"]) for s in segs]
    out = CliRunner().invoke(app, ["export", summary["run_id"], "--runs-dir", str(tmp_path), "--schedule"])
    assert out.exit_code == 0, out.output
    assert yaml.safe_load(out.output) == stored
    # the verl recipe: one launch per segment, each after the first resuming from the previous one's checkpoint
    launches = stored["verl"]["launches"]
    assert len(launches) == len(segs) == 3
    assert "trainer.resume_mode=disable" in launches[0]["overrides"]
    for prev, launch in zip(segs, launches[1:]):
        args = launch["overrides"]
        assert f"trainer.resume_from_path=checkpoints/mart-schedule/global_step_{prev['to_step']}" in args
        assert "trainer.resume_mode=resume_path" in args
    sh = CliRunner().invoke(app, ["export", summary["run_id"], "--runs-dir", str(tmp_path), "--schedule",
                                  "--format", "sh"])
    assert sh.exit_code == 0 and sh.output.count('$VERL "$@"') == 3, sh.output
    md = write_report(run_dir, "md").read_text()
    assert "## Schedule (stage 3)" in md and (run_dir / "report" / "schedule_tree.png").is_file()
    for s in segs:
        assert f"| {s['from_step']}-{s['to_step']} |" in md
    # the schedule's cost beside its score wherever its score shows: the export, --json, the terminal, the report
    sched = summary["schedule"]
    hours = (sched["static_gpu_hours"], sched["gpu_hours"], sched["search_gpu_hours"])
    assert all(h and h > 0 for h in hours)
    assert (stored["static_gpu_hours"], stored["gpu_hours"]) == hours[:2]
    as_json = json.loads(CliRunner().invoke(app, ["resume", summary["run_id"], "--runs-dir", str(tmp_path),
                                                  "--json"]).stdout)["schedule"]
    assert (as_json["static_gpu_hours"], as_json["gpu_hours"], as_json["search_gpu_hours"]) == hours
    text = [format(h, ".3g") for h in hours]
    terminal = CliRunner().invoke(app, ["resume", summary["run_id"], "--runs-dir", str(tmp_path)],
                                  terminal_width=200).stdout
    row = next(line for line in terminal.splitlines() if "GPU-hours of one run" in line)
    cells = [c.strip() for c in re.split(r"[│|┃]", row) if c.strip()]
    assert cells == ["schedule (GPU-hours of one run)", text[0], text[1], f"search: {text[2]}"], row
    head = next(line for line in md.splitlines() if line.startswith("- **schedule stage**"))
    head = re.sub(r"\\(.)", r"\1", head)  # as Markdown renders it (the report escapes its text)
    assert f"GPU-hours of one run {text[0]} → {text[1]} (search {text[2]})" in head, head
    from mart.graph.figures import stage_figures  # Slack's final message: each stage's sentence

    slack = next(f.sentence() for f in stage_figures(summary) if f.stage == "schedule")
    assert slack.endswith(f"; GPU-hours of one run {text[0]} → {text[1]} (search {text[2]})"), slack


@pytest.mark.timeout(120)
def test_llm_agents_propose_the_transitions(tmp_path, monkeypatch):
    from tests.support.openai_stub import OpenAIStub, PlausibleAgent

    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MART_LLM_MODEL", "OPENAI_API_BASE"):
        monkeypatch.delenv(name, raising=False)
    with OpenAIStub(default=PlausibleAgent(seed=3), max_lifetime_s=100) as stub:
        summary = tune(sim_options(tmp_path, agents="llm", llm_model="stub-model", llm_base_url=stub.base_url,
                                   llm_timeout_s=5, schedule_budget=5), api_key="sk-test")
        prompts = [r.prompt for r in stub.completions()]
    assert summary["status"] == "completed" and summary["agents"]["fallbacks"] == 0
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    rows = ledger.trials("schedule")
    check_tree(rows, sim_options(tmp_path))
    proposals = {p["candidate_id"]: p for p in ledger.table_rows("proposals")}
    ran = [r for r in rows if r["candidate_id"]]
    assert ran and all(proposals[r["candidate_id"]]["source"] == "llm" for r in ran)
    # the proposer was told which segment it proposes for, from which checkpoint, with the diagnosis there
    assert any("steps 4-8 (from the checkpoint at step 4" in p and "Diagnosis at the checkpoint" in p
               for p in prompts)


def test_the_winner_is_a_complete_schedule_that_beats_the_static_one_beyond_the_noise():
    from mart.state.schedule import pick_schedule_winner, recheck_plan

    def node(i, parent, depth, score, changes=None, signals=(), confirms=None, status="completed"):
        return {"id": i, "parent": parent, "depth": depth, "score": score, "changes": changes or {},
                "signals": list(signals), "confirms": confirms, "status": status}

    tree = [node("r", None, 1, 0.3), node("s", "r", 2, 0.4), node("a", "r", 2, 0.45, {"lr": 2}),
            node("ss", "s", 3, 0.50), node("as", "a", 3, 0.52), node("ab", "a", 3, 0.60, {"kl": 1}),
            node("ac", "a", 3, 0.61, {"t": 1}, signals=["health: entropy_collapse"])]
    assert [n["id"] for n in static_path(tree)] == ["r", "s", "ss"]
    # stage 2's evidence rule: a lead of 10 standard errors from one run is no evidence, the static one is kept
    winner, ranked = pick_schedule_winner(tree, 3, noise=0.01)
    assert winner.key == "ss" and {c.key for c in ranked} == {"ss", "as", "ab", "ac"}
    assert next(c for c in ranked if c.key == "ss").is_baseline
    # the re-check plan: the leader and the healthy ones too close to call, on their first runs
    assert recheck_plan(tree, 3, noise=0.01) == ["ab"]
    assert set(recheck_plan(tree, 3, noise=0.1)) >= {"ab", "ss"} and "ac" not in recheck_plan(tree, 3, noise=0.1)
    # re-run on a second seed, the clear lead wins; the collapsing leaf never wins over the close healthy one
    rerun = node("ab-s2", "a", 3, 0.59, confirms="ab")
    winner, _ = pick_schedule_winner([*tree, rerun], 3, noise=0.01)
    assert winner.key == "ab"
    # within the noise of the static schedule: the static one is kept (a change must be shown to help)
    winner, _ = pick_schedule_winner([*tree, rerun], 3, noise=0.1)
    assert winner.key == "ss"
    # a re-evaluation that failed counts against its leaf
    tree.append(node("ab-s2", "a", 3, None, confirms="ab", status="failed"))
    winner, _ = pick_schedule_winner(tree, 3, noise=0.01)
    assert winner.key != "ab"


def test_review_channels_show_the_branch_point_and_segment():
    from mart.graph.reviewers.base import format_request
    from mart.graph.reviewers.slack_blocks import summary_blocks

    request = {"review_no": 3, "run_id": "r", "stage": "schedule", "candidate_id": "sch-03-r0-c0", "source": "rules",
               "diff": [{"key": "actor_rollout_ref.actor.optim.lr", "current": 1e-6, "proposed": 2e-6}],
               "trials_done": 2, "parent_trial": "sch-01-baseline", "segment": [10, 20]}
    want = "sch-01-baseline's checkpoint at step 10: knobs for steps 10-20"
    assert want in format_request(request)
    assert any("`sch-01-baseline`'s checkpoint at step 10: knobs for steps 10-20" in str(b)
               for b in summary_blocks(request))
    assert "checkpoint" not in format_request({**request, "segment": None, "stage": "learning"})


def test_the_budget_carries_a_changed_schedule_to_the_horizon_beside_the_static_one(tmp_path):
    """S=4, K=3, the default budget S x K = 12: the search must not spend it all near the root -- a changed
    schedule and the static one both reach T (each expansion keeps room for one continuation per later
    segment and for the static path)."""
    opts = sim_options(tmp_path, schedule_segments=4, learning_horizon=12)
    summary = tune(opts)
    rows = Ledger.open(Path(tmp_path) / summary["run_id"]).trials("schedule")
    check_tree(rows, opts)
    assert len(rows) <= 12
    nodes = _nodes(rows)
    leaves = [r["trial_id"] for r in rows if r["horizon"] == 12 and not r["confirms"]]
    changed = [leaf for leaf in leaves if any(n["changes"] for n in path_to(nodes, leaf))]
    assert changed, "no changed schedule reached the horizon"
    assert len(static_path(nodes)) == 4


def test_the_wall_clock_ends_the_tree_with_what_it_has(tmp_path):
    summary = tune(sim_options(tmp_path, wall_clock_s=0.01))
    assert summary["status"] == "completed"
    sched = summary["schedule"]
    assert sched["branches_run"] == 1 and sched["segments"] == [] and sched["final_score"] is None
    assert any("wall-clock budget spent" in n for n in summary["notes"])
    assert any("no complete schedule reached the horizon" in n for n in summary["notes"])
    assert not (Path(tmp_path) / summary["run_id"] / "schedule.yaml").exists()


def test_a_carried_branch_reaches_the_horizon_from_the_re_evaluations_share(tmp_path):
    """Qwen2.5-1.5B on L40S, seed 3 (issue 44): the bundle led at step 45, but the search's share of the budget
    ran out with the other first-boundary branch's carry still reserved, nothing was affordable and the stage
    ended at 8 of 12 segment-trials with no changed schedule at T. The carry now comes out of the
    re-evaluations' share (a re-evaluation needs a complete changed schedule), and the budget still holds."""
    scenario = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "qwen2.5-1.5b-1x8-l40s.yaml"
    opts = sim_options(tmp_path, backend_options={"clock": "poll", "seed": 3, "scenario_file": str(scenario)},
                       seed=3, schedule_segments=4, schedule_branches=3, schedule_budget=12, learning_horizon=60)
    summary = tune(opts)
    rows = Ledger.open(Path(tmp_path) / summary["run_id"]).trials("schedule")
    check_tree(rows, opts)
    assert len(rows) <= 12
    nodes = _nodes(rows)
    leaves = [r["trial_id"] for r in rows if r["horizon"] == 60 and not r["confirms"]]
    assert any(any(n["changes"] for n in path_to(nodes, leaf)) for leaf in leaves), "no changed schedule at T"
    assert len(static_path(nodes)) == 4
