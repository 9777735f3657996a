"""The tuning graph end to end on the instant toy backend: stages, ledger, reviews, bad input."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mart.graph.reviewers.base import Reviewer
from mart.graph.session import resume, run_status, tune
from mart.state.ledger import Ledger
from mart.state.models import ReviewDecision
from mart.state.options import TuneOptions
from mart.state.run_store import NotAMartRun, RunLocked, RunNotFound, RunStore
from mart.state.search_space import ConfigError
from tests.support.oracles import assert_readme_shape, best_from_ledger
from tests.support.paths import REPO as REPO_ROOT
from tests.support.reviews import only
from tests.support.toy_backend import CKPT, MB, SEQS

TOY = "tests.support.toy_backend:make_backend"
REPO = REPO_ROOT


def options(tmp_path, **kw) -> TuneOptions:
    base = dict(backend=TOY, approve="auto", runs_dir=str(tmp_path), system_trials=4, learning_trials=3,
                system_horizon=5, learning_horizon=6, watch_interval_s=0.01, quiet=True, report=False,
                system_remeasure_share=0.25)  # stage 1's re-measurement is tested in tests/nodes/test_decisions_under_noise.py
    base.update(kw)
    return TuneOptions(**base)


class Scripted(Reviewer):
    """Answers reviews from a list; records what it was shown."""

    name = "scripted"

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests = []

    def review(self, request):
        self.requests.append(request)
        if not self.answers:
            return ReviewDecision(action="approve", reviewer="test", channel="test")
        return self.answers.pop(0)


def test_two_stage_session_improves_and_fills_the_ledger(tmp_path):
    summary = tune(options(tmp_path))
    assert_readme_shape(summary)
    assert summary["status"] == "completed"
    sys_, learn = summary["system"], summary["learning"]
    # the toy's landscape has better configs than its defaults in both stages (more rollout concurrency,
    # bigger micro batches; a higher learning rate): the rules agents must find one in each
    assert sys_["best_throughput"] > sys_["baseline_throughput"]
    assert learn["best_score"] > learn["baseline_score"]
    assert sys_["throughput_gain_pct"] > 5
    assert sys_["best_peak_memory_gb"] <= sys_["memory_limit_gb"]
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    trials = ledger.trials()
    # the best of each stage is the best eligible trial of the ledger, recomputed independently
    assert sys_["best_throughput"] == pytest.approx(best_from_ledger(trials, "system", sys_["memory_limit_gb"])["throughput"])
    assert learn["best_score"] == pytest.approx(best_from_ledger(trials, "learning", None)["score"])
    assert [t["stage"] for t in trials].count("system") == 4
    # the learning budget (3), plus stage 2's re-evaluations on a second seed (selection under noise)
    confirms = [t for t in trials if t["kind"] == "confirm"]
    assert [t["stage"] for t in trials if t["kind"] != "confirm"].count("learning") == 3
    assert len(confirms) <= TuneOptions().learning_confirm_trials
    assert all(t["stage"] == "learning" and t["confirms"] and t["seed"] == 1 for t in confirms)
    assert summary["trials"]["total"] == 7 + len(confirms)
    # learning trials keep the best system config fixed
    best_sys = sys_["best_config"]
    for t in trials:
        if t["stage"] == "learning":
            for k, v in best_sys.items():
                assert t["config"][k] == v
    assert ledger.table_rows("proposals") and ledger.table_rows("critiques")
    assert len(ledger.table_rows("reviews")) == 5  # one per candidate trial
    assert {r["stage"] for r in ledger.table_rows("stage_results")} == {"system", "learning"}
    assert ledger.metric_records(trials[0]["trial_id"])[-1].step == 5
    # no approved candidate ran twice
    cids = [t["candidate_id"] for t in trials if t["candidate_id"]]
    assert len(cids) == len(set(cids))


def test_rejection_feedback_reaches_the_proposer(tmp_path):
    feedback = "don't touch max_num_seqs; increase the ppo_micro_batch_size_per_gpu instead"
    reviewer = Scripted([ReviewDecision(action="reject", feedback=feedback, reviewer="ann", channel="test")])
    tune(options(tmp_path, system_trials=2, learning_trials=0), reviewer=reviewer)
    first, second = reviewer.requests[0], reviewer.requests[1]
    first, second = only(first), only(second)
    assert first["candidate_id"] != second["candidate_id"]
    changed = {d["key"] for d in second["diff"]}
    assert SEQS not in changed
    assert MB in changed
    up = next(d for d in second["diff"] if d["key"] == MB)
    assert up["proposed"] > up["current"]
    assert "reviewer asked" in second["rationale"].lower()


def test_edit_with_out_of_range_value_is_refused_and_run_stays_paused(tmp_path):
    paused = tune(options(tmp_path, approve="none"))
    assert paused["status"] == "paused"
    run = paused["run_id"]
    bad = ReviewDecision(action="edit", edits={MB: 10_000}, reviewer="bob", channel="cli")
    with pytest.raises(ConfigError, match="must lie in"):
        resume(run, tmp_path, decision=bad, quiet=True)
    with pytest.raises(ConfigError, match="not a tunable knob"):
        resume(run, tmp_path, decision=ReviewDecision(action="edit", edits={"trainer.foo": 1}, reviewer="bob",
                                                      channel="cli"), quiet=True)
    store = RunStore.open(run, tmp_path)
    info = run_status(store)
    assert info["status"] == "paused" and info["waiting_for"] == "review"
    assert only(info["pending_review"])["candidate_id"] == only(paused["pending_review"])["candidate_id"]
    assert Ledger.open(store.run_dir).table_rows("reviews") == []
    # a valid edit runs the edited config
    good = ReviewDecision(action="edit", edits={CKPT: False}, reviewer="bob", channel="cli")
    out = resume(run, tmp_path, decision=good, approve="none", quiet=True)
    assert out["status"] == "paused"
    trials = Ledger.open(store.run_dir).trials()
    assert trials[-1]["config"][CKPT] is False
    assert Ledger.open(store.run_dir).table_rows("reviews")[0]["action"] == "edit"


def test_detached_run_continues_review_by_review_without_repeating(tmp_path):
    first = tune(options(tmp_path, approve="none"))
    run = first["run_id"]
    store = RunStore.open(run, tmp_path)
    n_before = len(Ledger.open(store.run_dir).trials())
    assert n_before == 1  # only the baseline ran before the first review
    approve = ReviewDecision(action="approve", reviewer="cli", channel="cli")
    second = resume(run, tmp_path, decision=approve, quiet=True)
    assert second["status"] == "paused"
    assert second["pending_review"]["review_no"] == first["pending_review"]["review_no"] + 1
    trials = Ledger.open(store.run_dir).trials()
    assert len(trials) == 2
    assert trials[1]["candidate_id"] == only(first["pending_review"])["candidate_id"]


def test_bad_run_references(tmp_path):
    with pytest.raises(RunNotFound):
        RunStore.open("nope", tmp_path)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "mart.sqlite").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(NotAMartRun, match="not a readable mart database"):
        RunStore.open("junk", tmp_path)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    conn = sqlite3.connect(foreign / "mart.sqlite")
    conn.execute("create table t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(NotAMartRun, match="not a mart run"):
        RunStore.open(str(foreign), tmp_path)


def test_second_writer_is_refused(tmp_path):
    paused = tune(options(tmp_path, approve="none"))
    store = RunStore.open(paused["run_id"], tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from mart.state.run_store import RunStore\n"
         f"s = RunStore.open({paused['run_id']!r}, {str(tmp_path)!r})\n"
         "with s.lock():\n    print('locked', flush=True); time.sleep(30)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLocked, match="one writer per run"):
            resume(paused["run_id"], tmp_path, quiet=True)
        assert run_status(store)["status"] == "running"
        assert run_status(store)["driver_pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_state_round_trips_under_strict_msgpack(tmp_path):
    code = (
        "import json, sys\n"
        "from mart.state.options import TuneOptions\n"
        "from mart.graph.session import tune, graph_config\n"
        "from mart.graph.builder import compile_graph\n"
        "from mart.state.run_store import RunStore\n"
        "from mart.state.models import TrialRecord, Profile, Candidate\n"
        f"o = TuneOptions(backend={TOY!r}, approve='none', runs_dir={str(tmp_path)!r}, quiet=True, watch_interval_s=0.01)\n"
        "s = tune(o)\n"
        "store = RunStore.open(s['run_id'], o.runs_dir)\n"
        "g = compile_graph(store.checkpointer())\n"
        "v = g.get_state(graph_config(store.run_id)).values\n"
        "running = [r for h in g.get_state_history(graph_config(store.run_id)) for r in (h.values.get('running') or {}).values()]\n"
        "print(json.dumps([type(v['baseline']['system']).__name__, type(v['profiles']['system']).__name__,"
        " type(v['batch']).__name__, type(v['batch'].picks[0]).__name__, sorted({type(r).__name__ for r in running}),"
        " sorted({type(r.handle).__name__ for r in running if r.handle})]))\n"
    )
    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["TrialRecord", "Profile", "Batch", "Candidate",
                                                               ["RunningTrial"], ["TrialHandle"]]


def test_oom_and_margin_keep_best_feasible(tmp_path):
    # a tight capacity: big micro batches exceed the margin or OOM; the best must stay under the limit
    summary = tune(options(tmp_path, memory_capacity_gb=1.6, system_trials=6, learning_trials=0))
    assert summary["system"]["memory_limit_gb"] == pytest.approx(1.44)
    assert summary["system"]["best_peak_memory_gb"] <= 1.44


def test_vague_rejection_never_brings_the_same_candidate_back(tmp_path):
    no = ReviewDecision(action="reject", feedback="not convinced", reviewer="ann", channel="test")
    reviewer = Scripted([no, no, no])
    tune(options(tmp_path, system_trials=2, learning_trials=0), reviewer=reviewer)
    shown = [json.dumps(only(r)["overrides"], sort_keys=True) for r in reviewer.requests]
    assert len(shown) == 4 and len(set(shown)) == 4


def test_feedback_is_read_back_and_edits_take_short_names(tmp_path):
    reviewer = Scripted([
        ReviewDecision(action="reject", feedback="keep it simple: don't touch max_num_seqs, raise the micro batch",
                       reviewer="ann", channel="test"),
        ReviewDecision(action="edit", edits={"micro_batch": 8}, reviewer="ann", channel="test"),
    ])
    summary = tune(options(tmp_path, system_trials=2, learning_trials=0), reviewer=reviewer)
    assert "feedback_read" in reviewer.requests[0] and reviewer.requests[0]["feedback_read"] == []
    assert reviewer.requests[1]["feedback_read"] == ["raise micro_batch", "leave max_num_seqs alone"]
    trials = Ledger.open(Path(tmp_path) / summary["run_id"]).trials()
    assert len(reviewer.requests) == 2 and trials[1]["config"][MB] == 8  # the short name reached the full key


def test_a_budget_of_one_runs_only_the_baseline(tmp_path):
    summary = tune(options(tmp_path, system_trials=1, learning_trials=0))
    assert summary["trials"]["total"] == 1


def test_a_failing_progress_channel_does_not_fail_the_session(tmp_path, caplog):
    from mart.graph.reviewers.base import AutoReviewer

    class BrokenThread(AutoReviewer):  # e.g. Slack posts failing mid-session
        calls = 0

        def on_progress(self, event, line):
            BrokenThread.calls += 1
            raise ConnectionError("channel gone")

    out = tune(options(tmp_path, system_trials=2, learning_trials=0), reviewer=BrokenThread())
    assert out["status"] == "completed" and out["trials"]["total"] == 2
    assert BrokenThread.calls > 0 and "progress output failed (ConnectionError" in caplog.text
