"""`mart watch RUN`: a run paused at a review with no tuner alive keeps its trials in flight under the health monitor.

The toy's streaming trials advance one step per poll, from their own files, so a trial in flight while the run is
paused moves only when something polls it: here the watch, in this process, as `mart watch` would from another.
Oracles: the ledger's rows (reason, status, steps), the trials' own launch lines (``toy: start``), the run's lock.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mart.graph.paused_watch import watch_paused
from mart.graph.session import resume, run_status, tune
from mart.state.ledger import Ledger
from mart.state.models import CandidateDecision, ReviewDecision
from mart.state.options import TuneOptions
from mart.state.run_store import WATCH_LOCK, RunLocked, RunStore
from tests.support.toy_backend import ENT, LR, START_LINE

TOY = "tests.support.toy_backend:make_backend"


def _one_collapse_one_kl(request, kl: dict) -> ReviewDecision:
    """Review #1: one candidate whose entropy collapses after step 2 (stopped while the tuner runs), one whose KL
    blows up from step 5 (``kl["candidate"]``, still in flight at review #2)."""
    a, kl["candidate"] = (c["candidate_id"] for c in request["candidates"])
    return ReviewDecision(decisions=[CandidateDecision(type="edit", candidate_id=a, edits={LR: 0.05}),
                                     CandidateDecision(type="edit", candidate_id=kl["candidate"], edits={ENT: 0.05})],
                          reviewer="t", channel="t")


def _paused_with_a_sick_trial_in_flight(tmp_path, horizon: int = 10, approve: str = "none") -> tuple[str, str, RunStore]:
    """A run that paused at review #2 (nobody answers) with the KL-sick trial and the baseline in flight."""
    from mart.graph.reviewers.base import Reviewer

    kl: dict = {}

    class FirstOnly(Reviewer):
        name = "first-only"

        def review(self, request):
            return _one_collapse_one_kl(request, kl) if request["review_no"] == 1 else None

    opts = TuneOptions(backend=TOY, approve=approve, runs_dir=str(tmp_path), stages=["learning"], learning_trials=4,
                       learning_horizon=horizon, learning_confirm_trials=0, watch_interval_s=0.001, quiet=True,
                       report=False, parallel=3, backend_options={"stream": True, "kl_onset_step": 5})
    paused = tune(opts, reviewer=FirstOnly())
    assert paused["status"] == "paused" and paused["pending_review"]["review_no"] == 2
    store = RunStore.open(paused["run_id"], tmp_path)
    sick = next(t["trial_id"] for t in store.ledger.trials() if t["candidate_id"] == kl["candidate"])
    assert store.lock_holder() is None  # no tuner alive
    return paused["run_id"], sick, store


def test_a_sick_trial_of_a_paused_run_is_stopped_by_the_watch_and_collected_when_the_run_continues(tmp_path):
    run, sick, store = _paused_with_a_sick_trial_in_flight(tmp_path)
    in_flight = {t["trial_id"] for t in store.ledger.trials() if t["status"] == "running"}
    assert sick in in_flight and len(in_flight) == 2, in_flight  # the baseline runs beside it
    before = store.ledger.trial(sick)["steps_done"]
    assert before < 5  # not sick yet when the run paused

    heard: list[tuple[str, str]] = []
    out = watch_paused(run, tmp_path, interval_s=0.01, trust=True, told=lambda t, what: heard.append((t, what)))
    assert out["why"] == "every trial ended" and set(out["watched"]) == in_flight
    assert out["outcome"][sick].startswith("health: kl"), out  # stopped by the watch, with the rule's name
    (base,) = in_flight - {sick}
    assert out["outcome"][base] == "ended"  # the baseline is never stopped: it ran on to its end
    assert dict(heard) == out["outcome"]
    row = Ledger.open(store.run_dir).trial(sick)
    assert row["status"] == "running" and row["reason"] == out["outcome"][sick]  # marked; the graph collects it
    assert 5 <= len(Ledger.open(store.run_dir).metric_records(sick)) - 1 < 10  # its steps reached the ledger

    done = resume(run, tmp_path, decision=ReviewDecision.approve_all(reviewer="t", channel="t"), quiet=True,
                  approve="auto", trust=True)
    assert done["status"] == "completed"
    ledger = Ledger.open(store.run_dir)
    kl = ledger.trial(sick)
    assert kl["status"] == "stopped" and kl["early_stopped"] and kl["reason"] == out["outcome"][sick]
    assert 5 <= kl["steps_done"] < 10
    assert ledger.trial(base)["status"] == "completed" and ledger.trial(base)["steps_done"] == 10
    for tid in in_flight:  # taken in as they ended, never launched again
        log = (store.run_dir / "trials" / tid / "trial.log").read_text()
        assert log.count(START_LINE) == 1, tid


def test_the_watch_ends_when_a_driver_takes_the_run_and_never_blocks_one(tmp_path):
    run, _, store = _paused_with_a_sick_trial_in_flight(tmp_path, horizon=2000)
    result: dict = {}
    following = threading.Event()  # set once the watch has checked the run and follows its trials
    watcher = threading.Thread(target=lambda: result.update(watch_paused(
        run, tmp_path, interval_s=0.02, trust=True, started=lambda info: following.set())), daemon=True)
    watcher.start()
    assert following.wait(30), "the watch did not start"
    assert store.lock_holder(WATCH_LOCK) is not None
    assert run_status(store)["watcher_pid"] == os.getpid()  # `mart status` names the watch
    with pytest.raises(RunLocked, match="already watched"):  # one watch per run
        watch_paused(run, tmp_path, trust=True)
    driver = RunStore.open(run, tmp_path)
    with driver.lock():  # a driver (`mart review`, `resume`, the Slack server) is never refused by the watch
        watcher.join(timeout=10)
        assert not watcher.is_alive()
    assert result["why"] == "the run moved on", result
    assert len(result["outcome"]) < len(result["watched"])  # the baseline's 2000 steps had not all run
    driver.close()


def test_a_run_driven_now_or_with_nothing_in_flight_is_not_watched(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mart.graph.cli import app

    run, _, store = _paused_with_a_sick_trial_in_flight(tmp_path)
    status = CliRunner().invoke(app, ["status", run, "--runs-dir", str(tmp_path)])
    assert (f"no tuner watches the trials in flight: `mart watch {run} --runs-dir {tmp_path}` keeps the health "
            f"monitor on them, `mart stop {run} --runs-dir {tmp_path}` stops them") in status.stdout
    with RunStore.open(run, tmp_path).lock():
        out = CliRunner().invoke(app, ["watch", run, "--runs-dir", str(tmp_path), "--trust-run"])
        assert out.exit_code == 2 and "is being driven" in out.stderr
    watched = CliRunner().invoke(app, ["watch", run, "--runs-dir", str(tmp_path), "--trust-run", "--interval", "0.01"])
    assert watched.exit_code == 0, watched.stderr
    assert "watching 2 trial(s)" in watched.stdout and "stopped, health: kl" in watched.stdout
    again = CliRunner().invoke(app, ["watch", run, "--runs-dir", str(tmp_path), "--trust-run", "--json"])
    assert again.exit_code == 0 and '"why": "no trial in flight"' in again.stdout  # both ended: nothing to watch
    monkeypatch.delenv("MART_ALLOWED_BACKENDS")  # the suite allows the toy plugin everywhere; a user's box does not
    untrusted = CliRunner().invoke(app, ["watch", run, "--runs-dir", str(tmp_path)])
    assert untrusted.exit_code == 2 and "--trust-run" in untrusted.stderr  # a run folder names code: never run unasked
    assert Path(store.run_dir, WATCH_LOCK).exists()


def test_the_slack_server_watches_its_paused_runs_trials_and_says_so_in_the_review_thread(tmp_path):
    pytest.importorskip("slack_bolt")
    import secrets

    from mart.graph.reviewers.slack import record_message, slack_client
    from mart.graph.session import pending_review
    from mart.graph.slack_service import SlackReviewService
    from tests.support.slack_stub import SlackStub

    run, sick, store = _paused_with_a_sick_trial_in_flight(tmp_path, approve="slack")
    record_message(store.ledger, pending_review(store), "C0R", "9.000001")  # as SlackReviewer posted review #2
    other, _, _ = _paused_with_a_sick_trial_in_flight(tmp_path / "none")  # an --approve none run: not Slack's
    token = "xoxb-test-" + secrets.token_hex(8)
    with SlackStub(token) as stub:
        service = SlackReviewService(tmp_path, signing_secret="s", reviewers={"U0A"},
                                     client=slack_client(stub.api_url, token), token_verification=False)
        service.watch_interval_s = 0.01
        assert service.watch_paused_runs() == [run]
        assert service.wait_watches(timeout=30)
        assert service.watch_paused_runs() == []  # its trials have ended: nothing left to watch
        [post] = [c for c in stub.of("chat.postMessage") if sick in c["params"]["text"]]
    assert post["params"]["thread_ts"] == "9.000001" and "health: kl" in post["params"]["text"]
    assert Ledger.open(store.run_dir).trial(sick)["reason"].startswith("health: kl")
    assert RunStore.open(other, tmp_path / "none").lock_holder(WATCH_LOCK) is None
