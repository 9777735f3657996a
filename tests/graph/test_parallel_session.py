"""Several trials in flight (``--parallel N``): batch proposals that count the running trials, one review per batch,
a freed slot starting the next trial at once, health per trial, the slot limit a backend declares, bad input.

Oracles are computed from the ledger (trial intervals, config hashes, slots) and from the reviewer's own record of
what it was asked, never from the code under test. One-slot sessions are held by tests/graph/test_replay.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mart.graph.reviewers.base import Reviewer
from mart.graph.session import resume, tune
from mart.state.ledger import Ledger
from mart.state.models import CandidateDecision, ReviewDecision, config_hash
from mart.state.options import TuneOptions
from tests.support.paths import REPO
from tests.support.toy_backend import ENT, LR

TOY = "tests.support.toy_backend:make_backend"


def _options(tmp_path, **kw) -> TuneOptions:
    base = dict(backend=TOY, approve="auto", runs_dir=str(tmp_path), system_trials=7, learning_trials=5,
                system_horizon=5, learning_horizon=6, watch_interval_s=0.001, quiet=True, report=False, parallel=3,
                system_remeasure_share=0.25)  # stage 1's re-measurement is not what these tests are about
    base.update(kw)
    return TuneOptions(**base)


class Recording(Reviewer):
    """Approves everything (or answers with ``answer(request)``); keeps every request it was shown."""

    name = "recording"

    def __init__(self, answer=None):
        self.requests = []
        self.answer = answer

    def review(self, request):
        self.requests.append(request)
        if self.answer is not None:
            return self.answer(request)
        return ReviewDecision.approve_all(reviewer="test", channel="test")


def _overlap(a, b) -> bool:
    return a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"]


def _in_flight_at_each_start(trials) -> list[list[dict]]:
    """For each trial's start, the trials in flight at that instant (itself included)."""
    return [[u for u in trials if u["started_at"] <= t["started_at"] < u["ended_at"]] for t in trials]


def test_sim_session_runs_trials_side_by_side_without_repeating_a_config(tmp_path):
    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "virtual", "seed": 0},
                       approve="auto", system_trials=9, learning_trials=5, system_horizon=6, learning_horizon=12,
                       watch_interval_s=0.001, quiet=True, report=False, runs_dir=str(tmp_path), parallel=4,
                       system_remeasure_share=0.25)
    reviewer = Recording()
    summary = tune(opts, reviewer=reviewer)
    assert summary["status"] == "completed"
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    trials = ledger.trials()
    # budgets are kept: 9 stage-1 trials plus the re-measurement of the best beside the baseline (one round at the
    # default share: 2 trials), 5 stage-2 ones plus re-runs
    assert sum(t["stage"] == "system" and t["kind"] != "confirm" for t in trials) == 9
    assert sum(t["stage"] == "system" and t["kind"] == "confirm" for t in trials) <= 2
    assert sum(t["stage"] == "learning" and t["kind"] != "confirm" for t in trials) == 5
    # never more than 4 at once, each in a slot of its own, and some really side by side
    assert {t["slot"] for t in trials} <= {0, 1, 2, 3}
    for at_once in _in_flight_at_each_start(trials):
        assert len(at_once) <= 4
        assert len({u["slot"] for u in at_once}) == len(at_once), "two trials in flight shared a slot"
    assert max(len(x) for x in _in_flight_at_each_start(trials)) == 4
    # no config runs twice in a stage (a re-run on another seed is a re-run, not a repeat)
    for stage in ("system", "learning"):
        hashes = [config_hash(t["config"]) for t in trials if t["stage"] == stage and t["kind"] != "confirm"]
        assert len(hashes) == len(set(hashes))
    # one review per decision point, covering the candidates of the free slots; batches after the baseline
    sizes = [len(r["candidates"]) for r in reviewer.requests]
    assert all(1 <= s <= 4 for s in sizes) and max(sizes) >= 3
    # the first batch starts beside the baseline (the job model proposes before any measurement): 3 free slots
    first = reviewer.requests[0]
    assert first["stage"] == "system" and first["running"] == ["sys-01-baseline"] and len(first["candidates"]) == 3
    for r in reviewer.requests:  # the review names what was still running when it was asked
        assert len(r["running"]) + len(r["candidates"]) <= 4
        assert [a["args"]["candidate_id"] for a in r["action_requests"]] == [c["candidate_id"] for c in r["candidates"]]
    assert summary["parallel"]["slots"] == 4 and 0 < summary["parallel"]["busy_fraction"] <= 1
    ledger.close()


def test_a_baseline_that_ends_after_faster_candidates_does_not_take_the_lead_back(tmp_path):
    # 4 slots, a budget of 4: the baseline and the first batch start together, and the defaults' trial is the
    # slowest, so it ends last; the winner is still the fastest trial within the margin. Two steps a trial: no early
    # look (it needs a step after it), so the baseline is not cut there and does run to its end
    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "virtual", "seed": 0},
                       approve="auto", agents="rules", system_trials=4, stages=["system"], system_horizon=2,
                       watch_interval_s=0.001, quiet=True, report=False, runs_dir=str(tmp_path), parallel=4,
                       system_remeasure_share=0.25)
    summary = tune(opts)
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    rows = ledger.trials("system")
    ledger.close()
    base = next(r for r in rows if r["kind"] == "baseline")
    assert base["ended_at"] == max(r["ended_at"] for r in rows), "the scenario no longer ends with the baseline"
    limit = summary["system"]["memory_limit_gb"]
    fits = [r for r in rows if r["status"] == "completed" and r["throughput"] and r["peak_memory_gb"] <= limit]
    fastest = max(fits, key=lambda r: r["throughput"])
    assert fastest["kind"] == "candidate"
    assert summary["system"]["best_throughput"] == pytest.approx(fastest["throughput"], rel=1e-6)
    assert not summary["system"]["kept_baseline"]
    assert summary["system"]["best_config"] == fastest["overrides"]


def test_a_freed_slot_starts_the_next_trial_the_instant_it_frees(tmp_path):
    # on the virtual clock a fast config ends first: the next trial must start in its slot at that instant (a
    # tuner decides in no simulated time), while the slow ones run on
    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "virtual", "seed": 0},
                       approve="auto", stages=["system"], system_trials=8, system_horizon=6, watch_interval_s=0.001,
                       quiet=True, report=False, runs_dir=str(tmp_path), parallel=3,
                       system_remeasure_share=0.25)
    summary = tune(opts)
    run = Path(tmp_path) / summary["run_id"]
    times = {}
    for meta in (run / "trials").glob("*/sim_trial.json"):
        m = json.loads(meta.read_text())
        state = json.loads((meta.parent / "sim_state.json").read_text())
        times[m["spec"]["trial_id"]] = (m["sim_start"], m["sim_start"] + state["sim_elapsed_s"])
    ledger = Ledger.open(run)
    by_slot: dict[int, list[tuple[float, float]]] = {}
    rows = ledger.trials()
    for t in rows:
        if t["kind"] != "confirm":  # the search's trials; the re-measurement waits for its end (below)
            by_slot.setdefault(t["slot"], []).append(times[t["trial_id"]])
    ledger.close()
    # the baseline and the best are re-measured once the search is over: the best is known only then
    search_end = max(e for _, e in (times[t["trial_id"]] for t in rows if t["kind"] != "confirm"))
    remeasured = [times[t["trial_id"]] for t in rows if t["kind"] == "confirm"]
    assert remeasured and all(s0 == pytest.approx(search_end, abs=1e-6) for s0, _ in remeasured)
    refills = [(prev, nxt) for runs in by_slot.values() for prev, nxt in zip(sorted(runs), sorted(runs)[1:])]
    assert refills
    for prev, nxt in refills:  # no idle slot time between a trial's end and its successor's start
        assert nxt[0] == pytest.approx(prev[1], abs=1e-6), by_slot
    # and some refill happened while a trial of another slot still ran (the batch never waits for its slowest)
    assert any(s0 < nxt[0] < e0 for _, nxt in refills for s0, e0 in times.values()), by_slot


def _sim_times(run: Path) -> dict[str, tuple[float, float, list]]:
    """trial id -> (simulated start, simulated end, its planned metric lines as [time from its start, step, data])."""
    out = {}
    for meta in (run / "trials").glob("*/sim_trial.json"):
        m = json.loads(meta.read_text())
        state = json.loads((meta.parent / "sim_state.json").read_text())
        plan = json.loads((meta.parent / "sim_plan.json").read_text())
        out[m["spec"]["trial_id"]] = (m["sim_start"], m["sim_start"] + state["sim_elapsed_s"], plan["events"])
    return out


def test_a_stage1_backfill_is_predicted_from_the_early_steps_of_the_trials_still_running(tmp_path):
    # with several slots every stage-1 trial is looked at after its second step: the proposal for a slot that
    # frees while others run comes from a job model that counts what those logged by then, not only the ended ones
    from mart.nodes.agents.job_model import JobModel, observation_from_records
    from mart.nodes.stages.system import CUT_REASON
    from mart.state.metrics import StepRecord
    from mart.state.objectives import peak_memory_gb
    from mart.trial_runner.sim.backend import SimBackend

    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "virtual", "seed": 0},
                       approve="auto", stages=["system"], system_trials=6, system_horizon=6, watch_interval_s=0.001,
                       quiet=True, report=False, runs_dir=str(tmp_path), parallel=4,
                       system_remeasure_share=0.25)
    reviewer = Recording()
    summary = tune(opts, reviewer=reviewer)
    run = Path(tmp_path) / summary["run_id"]
    times = _sim_times(run)
    ledger = Ledger.open(run)
    rows = {t["trial_id"]: t for t in ledger.trials()}
    by_cand = {t["candidate_id"]: t for t in rows.values() if t["candidate_id"]}
    preds = ledger.predictions(summary["run_id"])
    ledger.close()
    assert reviewer.requests[0]["running"] == ["sys-01-baseline"]  # the first batch starts beside the baseline
    backfill = reviewer.requests[1]  # the first slot that freed
    at = times[by_cand[backfill["candidates"][0]["candidate_id"]]["trial_id"]][0]  # its simulated instant
    backend = SimBackend(scenario="qwen3-0.6b-1x8", seed=0)
    base = backend.base_config()

    def lines(tid):
        text = (run / "trials" / tid / "metrics.jsonl").read_text().splitlines()
        return [StepRecord(x["step"], x["data"]) for x in map(json.loads, text)]

    ended, early = [], []
    for tid, (start, end, events) in times.items():
        if end <= at + 1e-6 and (rows[tid]["reason"] or "").startswith(CUT_REASON):
            # ended by then, cut at its look (the baseline, with the bets beside it far faster): from the look on
            r, p = rows[tid], preds.get(rows[tid]["candidate_id"] or "", {})
            thr = [x.data["perf/throughput"] for x in lines(tid) if x.step >= 2]
            ended.append(observation_from_records(
                r["config"], lines(tid), peak_gb=r["peak_memory_gb"], oom=False, throughput=sum(thr) / len(thr),
                window=(2, 6), predicted_peak_gb=p.get("predicted_memory_gb"),
                predicted_throughput=p.get("predicted_throughput")))
        elif end <= at + 1e-6:  # ended by then: what the ledger says it measured
            r, p = rows[tid], preds.get(rows[tid]["candidate_id"] or "", {})
            ended.append(observation_from_records(
                r["config"], lines(tid), peak_gb=r["peak_memory_gb"], oom=r["status"] == "oom",
                throughput=r["throughput"], window=(3, 5), predicted_peak_gb=p.get("predicted_memory_gb"),
                predicted_throughput=p.get("predicted_throughput")))
        elif start < at:  # still running: its lines logged by then, from its second step on
            steps = {step for t, step, _ in events if start + t <= at + 1e-6}
            seen = [x for x in lines(tid) if x.step in steps]
            assert max(steps) >= 2, "a running trial was not looked at yet"
            thr = [x.data["perf/throughput"] for x in seen if x.step >= 2]
            peak = peak_memory_gb(seen)  # the reading the session takes (the device-wide one where measured)
            early.append(observation_from_records(rows[tid]["config"], seen, peak_gb=peak,
                                                  oom=False, throughput=sum(thr) / len(thr), window=(2, 6)))
    assert ended and early, (ended, early)
    assert sorted(backfill["running"]) == sorted(tid for tid, (s, e, _) in times.items() if s < at < e - 1e-6)
    informed = JobModel(backend.describe_job(), base).fit(ended + early)
    ended_only = JobModel(backend.describe_job(), base).fit(ended)
    for c in backfill["candidates"]:
        config = by_cand[c["candidate_id"]]["config"]
        kept = preds[c["candidate_id"]]["predicted_throughput"]
        # the model that holds the running trials' early steps is the one the prediction came from (since the
        # job model's memory comes from torch's accounting, a refit here lands within a few percent of the session's
        # own, not to the digit: the figure to beat is the ended-only model's)
        informed_gap = abs(kept / informed.predict(config).throughput - 1)
        assert informed_gap < 0.05 and informed_gap < abs(kept / ended_only.predict(config).throughput - 1)
    # and the early steps count: the model that holds them predicts the running trials' configs otherwise
    running = [rows[tid]["config"] for tid, (s, e, _) in times.items() if s < at < e - 1e-6]
    assert max(abs(informed.predict(c).throughput / ended_only.predict(c).throughput - 1) for c in running) > 0.005


def test_a_stage1_trial_far_below_the_best_at_its_early_look_is_cut_and_its_slot_starts_the_next(tmp_path):
    # with several slots a candidate whose throughput since its look is below CUT_SHARE of what another trial
    # within the margin measured over the same steps cannot win: it is stopped there and the next one starts
    from mart.nodes.stages.system import CUT_REASON, CUT_SHARE, EARLY_LOOK_STEP
    from mart.state.metrics import THROUGHPUT_KEY, mean_over_steps

    seqs = "actor_rollout_ref.rollout.max_num_seqs"

    def answer(request):  # the reviewer makes the first bet beside the baseline a very slow one
        if not answer.ids:
            answer.ids = [c["candidate_id"] for c in request["candidates"]]
            return ReviewDecision(decisions=[CandidateDecision(type="edit", edits={seqs: 16})],
                                  reviewer="t", channel="t")
        return ReviewDecision.approve_all(reviewer="t", channel="t")

    answer.ids = []
    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "virtual", "seed": 0},
                       approve="auto", stages=["system"], system_trials=4, system_horizon=6, watch_interval_s=0.001,
                       quiet=True, report=False, runs_dir=str(tmp_path), parallel=2)
    summary = tune(opts, reviewer=Recording(answer))
    run = Path(tmp_path) / summary["run_id"]
    ledger = Ledger.open(run)
    rows = {t["trial_id"]: t for t in ledger.trials()}
    [slow] = [t for t in rows.values() if t["candidate_id"] in answer.ids]
    [base] = [t for t in rows.values() if t["kind"] == "baseline"]
    assert slow["config"][seqs] == 16 and _overlap(slow, base)
    assert slow["status"] == "stopped" and slow["early_stopped"] and slow["reason"].startswith(CUT_REASON), slow
    assert EARLY_LOOK_STEP <= slow["steps_done"] < 6 and slow["throughput"] is None
    # the cut is what the rule says: over the same steps the baseline measured more than 1 / CUT_SHARE as much
    last = slow["steps_done"]
    own = mean_over_steps(ledger.metric_records(slow["trial_id"]), THROUGHPUT_KEY, EARLY_LOOK_STEP, last)
    ref = mean_over_steps(ledger.metric_records(base["trial_id"]), THROUGHPUT_KEY, EARLY_LOOK_STEP, last)
    assert own < CUT_SHARE * ref
    # the baseline (nothing ran faster over its steps: not cut) ran on to its end; the cut came at the instant its look's line was logged (simulated
    # time), and the freed slot started the next trial at that instant
    assert base["status"] == "completed" and base["steps_done"] == 6
    times = _sim_times(run)
    start, end, events = times[slow["trial_id"]]
    look_line = next(t for t, step, _ in events if step == EARLY_LOOK_STEP)
    assert end == pytest.approx(start + look_line, abs=1e-3)
    assert any(times[t][0] == pytest.approx(end, abs=1e-3) for t in rows if t != slow["trial_id"])
    # no trial that ran to its end was cut: each was within CUT_SHARE of the best when it was looked at
    assert [t["trial_id"] for t in rows.values() if (t["reason"] or "").startswith(CUT_REASON)] == [slow["trial_id"]]
    ledger.close()


def test_one_review_covers_the_batch_and_a_rejected_slot_is_proposed_again_with_the_feedback(tmp_path):
    def answer(request):
        if request["stage"] == "system" and len(request["candidates"]) > 1 and not answer.done:
            answer.done = True
            answer.rejected = request["candidates"][0]["candidate_id"]
            return ReviewDecision(decisions=[CandidateDecision(type="reject", candidate_id=answer.rejected,
                                                               message="use less memory"),
                                             CandidateDecision(type="approve")], reviewer="t", channel="t")
        return ReviewDecision.approve_all(reviewer="t", channel="t")

    answer.done = False
    reviewer = Recording(answer)
    summary = tune(_options(tmp_path), reviewer=reviewer)
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    reviews = ledger.table_rows("reviews")
    rejected = [r for r in reviews if r["action"] == "reject"]
    assert [r["candidate_id"] for r in rejected] == [answer.rejected]
    first = next(r for r in reviewer.requests if any(c["candidate_id"] == answer.rejected for c in r["candidates"]))
    batch = [c["candidate_id"] for c in first["candidates"]]
    # the other candidates of that review ran; the rejected one never did
    ran = {t["candidate_id"] for t in ledger.trials()}
    assert answer.rejected not in ran and set(batch) - {answer.rejected} <= ran
    # the next review was asked with the reviewer's words read back
    after = reviewer.requests[reviewer.requests.index(first) + 1]
    assert after["feedback_read"], after
    assert len({r["review_no"] for r in reviews}) == len(reviewer.requests)
    ledger.close()


def test_a_sick_trial_is_stopped_while_the_others_run_on(tmp_path):
    # toy stream: lr > 0.02 collapses its entropy after step 2. With 2 slots the first candidate starts beside
    # the stage's baseline: the reviewer makes it the sick one, and the baseline must run on to its end
    def answer(request):
        if request["stage"] == "learning" and not answer.ids:
            answer.ids = [c["candidate_id"] for c in request["candidates"]]
            answer.running = list(request["running"])
            return ReviewDecision(decisions=[CandidateDecision(type="edit", edits={LR: 0.05, ENT: 0.0})],
                                  reviewer="t", channel="t")
        return ReviewDecision.approve_all(reviewer="t", channel="t")

    answer.ids = []
    opts = _options(tmp_path, backend_options={"stream": True}, parallel=2, stages=["learning"], learning_trials=3,
                    learning_horizon=8, learning_confirm_trials=0)
    summary = tune(opts, reviewer=Recording(answer))
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    trials = ledger.trials()
    by_cand = {t["candidate_id"]: t for t in trials}
    [sick] = [by_cand[c] for c in answer.ids]
    [base] = [t for t in trials if t["kind"] == "baseline"]
    assert answer.running == [base["trial_id"]]  # it was reviewed while the baseline ran
    assert sick["status"] == "stopped" and sick["early_stopped"] and "entropy_collapse" in sick["reason"]
    assert sick["steps_done"] < 8
    assert base["status"] == "completed" and base["steps_done"] == 8 and not base["early_stopped"]
    assert _overlap(sick, base)  # side by side, and only the sick one was stopped
    ledger.close()


def test_fewer_slots_than_asked_when_the_backend_holds_fewer_and_the_summary_says_why(tmp_path):
    opts = _options(tmp_path, backend_options={"max_parallel": 2}, parallel=5, stages=["system"])
    reviewer = Recording()
    summary = tune(opts, reviewer=reviewer)
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    assert {t["slot"] for t in ledger.trials()} <= {0, 1}
    assert max(len(r["candidates"]) for r in reviewer.requests) == 2
    assert summary["parallel"] == {**summary["parallel"], "slots": 2, "asked": 5}
    assert any("--parallel 5" in n and "runs 2 trial(s) at once" in n and "the toy holds 2" in n
               for n in summary["notes"])
    ledger.close()


@pytest.mark.parametrize("value", ["0", "-2", "abc", "1.5"])
def test_bad_parallel_values_are_refused_in_one_line_before_a_run_folder_exists(tmp_path, value):
    out = subprocess.run([sys.executable, "-m", "mart.graph.cli", "tune", "--backend", TOY, "--approve", "auto",
                          "--parallel", value, "--runs-dir", str(tmp_path / "runs")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    err = out.stderr.strip()
    assert "--parallel" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err  # one line, not typer's box
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_schedule_branches_of_a_node_run_side_by_side_and_the_tree_stays_whole(tmp_path):
    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen3-0.6b-1x8", "clock": "virtual", "seed": 1},
                       approve="auto", stages=["schedule"], learning_horizon=12, schedule_segments=3,
                       schedule_branches=3, watch_interval_s=0.001, quiet=True, report=False, runs_dir=str(tmp_path),
                       parallel=3)
    reviewer = Recording()
    summary = tune(opts, reviewer=reviewer)
    assert summary["status"] == "completed" and summary["schedule"]["winner"]
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    rows = ledger.trials("schedule")
    by_parent: dict[str, list[dict]] = {}
    for r in rows:
        if r["parent_trial"] and not r["confirms"]:
            by_parent.setdefault(r["parent_trial"], []).append(r)
    # an expanded node's branches (the unchanged continuation and the reviewed transitions) ran at once
    full = [kids for kids in by_parent.values() if len(kids) == 3]
    assert full, by_parent
    for kids in full:
        assert all(_overlap(a, b) for a in kids for b in kids if a is not b)
        assert sum(not k["overrides"] for k in kids) == 1  # one unchanged continuation per expansion
    # one review per expansion covered its transitions together
    assert any(len(r["candidates"]) == 2 for r in reviewer.requests)
    assert len(rows) <= opts.schedule_trial_budget()
    ledger.close()



class WaitingReviewer(Recording):
    """A person at the terminal (``waits``): review #2 is answered only once the trial of candidate
    ``kl["candidate"]`` has a health stop in the ledger (or after ``patience`` seconds); ``seen`` is its ledger row
    at that moment, ``sick`` its trial id."""

    name = "waiting"
    waits = True

    def __init__(self, answer, runs_dir: Path, kl: dict, patience: float = 20.0):
        super().__init__(answer)
        self.runs_dir, self.kl, self.patience, self.seen, self.sick = runs_dir, kl, patience, None, None

    def review(self, request):
        if request["review_no"] == 2:
            (run,) = [p for p in self.runs_dir.iterdir() if p.is_dir()]
            ledger = Ledger.open(run)
            self.sick = next(t["trial_id"] for t in ledger.trials() if t["candidate_id"] == self.kl["candidate"])
            deadline = time.monotonic() + self.patience
            while time.monotonic() < deadline and not (
                    (ledger.trial(self.sick) or {}).get("reason") or "").startswith("health:"):
                time.sleep(0.05)
            self.seen = ledger.trial(self.sick)
            ledger.close()
        return super().review(request)


def _one_collapse_one_kl(request, kl: dict) -> ReviewDecision:
    """Review #1's answer: its first candidate with a learning rate that collapses the entropy after step 2, its
    second with an entropy bonus that blows the KL up (``kl["candidate"]``)."""
    a, kl["candidate"] = (c["candidate_id"] for c in request["candidates"])
    return ReviewDecision(decisions=[CandidateDecision(type="edit", candidate_id=a, edits={LR: 0.05}),
                                     CandidateDecision(type="edit", candidate_id=kl["candidate"], edits={ENT: 0.05})],
                          reviewer="t", channel="t")


def test_a_sick_trial_is_stopped_while_a_person_answers_a_review(tmp_path):
    # toy stream (a step per poll): lr > 0.02 collapses the entropy after step 2, an entropy bonus > 0.03 blows
    # the KL up from step 5. Review #1 makes one candidate of each kind beside the baseline; the first is stopped
    # at step 3, and review #2 (for its slot) is asked while the KL-sick one runs: that one must be stopped while
    # the person still thinks, not when the answer comes
    kl: dict = {}

    def answer(request):
        if request["review_no"] == 1:
            return _one_collapse_one_kl(request, kl)
        return ReviewDecision.approve_all(reviewer="t", channel="t")

    opts = _options(tmp_path, backend_options={"stream": True, "kl_onset_step": 5}, parallel=3, stages=["learning"],
                    learning_trials=4, learning_horizon=10, learning_confirm_trials=0)
    reviewer = WaitingReviewer(answer, Path(tmp_path), kl)
    summary = tune(opts, reviewer=reviewer)
    assert len(reviewer.requests) >= 2 and reviewer.sick in reviewer.requests[1]["running"]
    seen = reviewer.seen
    assert seen is not None and seen["reason"].startswith("health: kl"), seen  # stopped before the answer came
    assert seen["status"] == "running"  # by the watch during the review; the graph collects it afterwards
    ledger = Ledger.open(Path(tmp_path) / summary["run_id"])
    kl = ledger.trial(reviewer.sick)
    assert kl["status"] == "stopped" and kl["early_stopped"] and kl["reason"] == seen["reason"]
    assert 5 <= kl["steps_done"] < 10
    [base] = [t for t in ledger.trials() if t["kind"] == "baseline"]
    assert base["status"] == "completed" and base["steps_done"] == 10  # the healthy trial ran on to its end
    ledger.close()


def test_a_review_answered_later_at_the_terminal_watches_the_trials_in_flight_too(tmp_path):
    # as above, but review #2 finds nobody (the run pauses with the KL-sick trial in flight); `mart review RUN` at
    # the terminal later answers it through `resume`, and the trial is stopped while that person thinks
    class Leaves(Recording):
        def review(self, request):
            return None if request["review_no"] == 2 else super().review(request)

    kl: dict = {}
    opts = _options(tmp_path, backend_options={"stream": True, "kl_onset_step": 5}, parallel=3, stages=["learning"],
                    learning_trials=4, learning_horizon=10, learning_confirm_trials=0)
    paused = tune(opts, reviewer=Leaves(lambda request: _one_collapse_one_kl(request, kl)))
    assert paused["status"] == "paused" and paused["pending_review"]["review_no"] == 2
    later = WaitingReviewer(lambda request: ReviewDecision.approve_all(reviewer="t", channel="t"), Path(tmp_path), kl)
    summary = resume(paused["run_id"], tmp_path, reviewer=later, quiet=True)
    assert summary["status"] == "completed"
    assert later.seen is not None and later.seen["reason"].startswith("health: kl"), later.seen
    kl = Ledger.open(Path(tmp_path) / paused["run_id"]).trial(later.sick)
    assert kl["status"] == "stopped" and kl["early_stopped"] and 5 <= kl["steps_done"] < 10
