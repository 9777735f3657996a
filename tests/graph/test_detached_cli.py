"""Detached pauses through the real CLI: `mart tune --approve none` exits at the first review, the run
is answered later by `mart review` (flags or the terminal), one review at a time, nothing repeated.

The steps that show a process exiting and another one continuing the run are separate processes
(``mart`` = ``python -m mart.graph.cli``); the rest call the same typer app in-process (each fresh
interpreter costs seconds of imports on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from mart.state.ledger import Ledger
from mart.state.run_store import RunStore
from tests.support.paths import REPO as REPO_ROOT
from tests.support.reviews import only
from tests.support.toy_backend import CKPT, MB

REPO = REPO_ROOT
TOY = "tests.support.toy_backend:make_backend"


def mart(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "mart.graph.cli", *args], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120, check=False)


def cli(*args: str, stdin: str | None = None):
    """The same command line, in this process."""
    from typer.testing import CliRunner

    from mart.graph.cli import app

    return CliRunner().invoke(app, list(args), input=stdin)


def ok_json(out):
    code = getattr(out, "returncode", getattr(out, "exit_code", None))
    assert code == 0, out.stderr
    return json.loads(out.stdout)


def test_detached_run_is_answered_review_by_review(tmp_path):
    runs = str(tmp_path)
    first = ok_json(mart("tune", "--backend", TOY, "--approve", "none", "--runs-dir", runs, "--system-trials", "4",
                         "--learning-trials", "0", "--system-horizon", "3", "--json"))
    run = first["run_id"]
    assert first["status"] == "paused" and first["pending_review"]["review_no"] == 1
    store = RunStore.open(run, runs)
    assert store.lock_holder() is None  # the tuner exited: nothing holds the run, nothing spins
    assert [t["kind"] for t in Ledger.open(store.run_dir).trials()] == ["baseline"]

    listing = ok_json(mart("status", "--runs-dir", runs, "--pending", "--json"))  # another process sees the pause
    assert [(i["run_id"], i["status"], i["waiting_for"]) for i in listing] == [(run, "paused", "review")]
    assert listing[0]["pending_review"]["interrupt_id"] == first["pending_review"]["interrupt_id"]
    table = cli("status", "--runs-dir", runs)
    assert table.exit_code == 0 and f"mart review {run}" in table.stdout

    # approve from a script: the same run continues to the next review, then exits again
    second = ok_json(mart("review", run, "--runs-dir", runs, "--approve", "--detach", "--json", "-q"))
    assert second["status"] == "paused" and second["pending_review"]["review_no"] == 2
    trials = Ledger.open(store.run_dir).trials()
    assert [t["kind"] for t in trials] == ["baseline", "candidate"]  # the baseline did not run again
    assert trials[1]["candidate_id"] == only(first["pending_review"])["candidate_id"]

    # an invalid edit is refused and changes nothing
    bad = cli("review", run, "--runs-dir", runs, "--edit", f"{MB}=10000", "--detach")
    assert bad.exit_code == 2 and "must lie in" in bad.stderr
    info = ok_json(cli("status", run, "--runs-dir", runs, "--json"))
    assert info["pending_review"]["interrupt_id"] == second["pending_review"]["interrupt_id"]
    assert info["status"] == "paused" and info["driver_pid"] is None

    # reject from the terminal (no flags): the proposer gets the feedback, no trial runs
    third = ok_json(mart("review", run, "--runs-dir", runs, "--detach", "--json", "--reviewer", "ann",
                         stdin="r\nkeep the micro batch as it is\n"))
    assert third["pending_review"]["review_no"] == 3
    assert only(third["pending_review"])["candidate_id"] != only(second["pending_review"])["candidate_id"]
    assert len(Ledger.open(store.run_dir).trials()) == 2

    # a valid edit runs the edited config
    fourth = ok_json(cli("review", run, "--runs-dir", runs, "--edit", f"{CKPT}=false", "--detach", "--json", "-q"))
    assert fourth["pending_review"]["review_no"] == 4
    ledger = Ledger.open(store.run_dir)
    trials = ledger.trials()
    assert len(trials) == 3 and trials[-1]["config"][CKPT] is False
    reviews = ledger.table_rows("reviews")
    assert [(r["action"], r["channel"]) for r in reviews] == [("approve", "cli"), ("reject", "tty"), ("edit", "cli")]
    assert reviews[1]["reviewer"] == "ann" and reviews[1]["feedback"] == "keep the micro batch as it is"
    # nothing repeated: each trial and each approved candidate once
    ids = [t["trial_id"] for t in trials]
    cids = [t["candidate_id"] for t in trials if t["candidate_id"]]
    assert len(ids) == len(set(ids)) and len(cids) == len(set(cids))

    # the terminal may also decide later: EOF at the prompt leaves the run paused
    later = ok_json(cli("review", run, "--runs-dir", runs, "--json", stdin=""))
    assert later["status"] == "paused" and later["pending_review"]["review_no"] == 4

    # --detach on any channel behaves like --approve none
    other = ok_json(cli("tune", "--backend", TOY, "--approve", "tty", "--detach", "--runs-dir", runs, "--json",
                        "-q", "--system-trials", "2", "--learning-trials", "0", "--system-horizon", "2"))
    assert other["status"] == "paused"
    assert ok_json(cli("review", other["run_id"], "--runs-dir", runs, "--approve", "--json", "-q"))["status"] == "completed"
    done = cli("review", other["run_id"], "--runs-dir", runs, "--approve")
    assert done.exit_code == 2 and "completed" in done.stderr


def test_a_batch_review_is_answered_candidate_by_candidate_from_the_command_line(tmp_path):
    """`mart review RUN --reject TEXT --candidate ID --others approve`: one candidate of a batch rejected with
    feedback, the rest approved, in one answer; naming one candidate without --others changes nothing."""
    runs = str(tmp_path)
    first = ok_json(cli("tune", "--backend", "sim", "--parallel", "3", "--approve", "none", "--runs-dir", runs,
                        "--system-trials", "5", "--learning-trials", "0", "--json"))
    run, request = first["run_id"], first["pending_review"]
    ids = [c["candidate_id"] for c in request["candidates"]]
    assert len(ids) == 2  # the baseline runs in slot 1, the review fills the other two

    half = cli("review", run, "--runs-dir", runs, "--approve", "--candidate", ids[0], "--detach")
    assert half.exit_code == 2 and "--others approve|reject" in half.stderr and ids[1] in half.stderr
    unknown = cli("review", run, "--runs-dir", runs, "--approve", "--candidate", "sys-99-r0-c9", "--detach")
    assert unknown.exit_code == 2 and "has no candidate sys-99-r0-c9" in unknown.stderr
    info = ok_json(cli("status", run, "--runs-dir", runs, "--json"))
    assert info["pending_review"]["interrupt_id"] == request["interrupt_id"]  # nothing was decided
    assert [t["kind"] for t in Ledger.open(RunStore.open(run, runs).run_dir).trials()] == ["baseline"]

    nxt = ok_json(cli("review", run, "--runs-dir", runs, "--reject", "too close to the memory limit",
                      "--candidate", ids[1], "--others", "approve", "--detach", "--json", "-q"))
    assert nxt["status"] in ("paused", "completed")
    ledger = Ledger.open(RunStore.open(run, runs).run_dir)
    launched = [t["candidate_id"] for t in ledger.trials() if t["kind"] == "candidate"]
    assert ids[0] in launched and ids[1] not in launched
    first_review = [r for r in ledger.table_rows("reviews") if r["review_no"] == 1]
    by_action = {r["action"]: r for r in first_review}
    assert set(by_action) == {"approve", "reject"}, first_review
    assert by_action["reject"]["feedback"] == "too close to the memory limit"
    assert by_action["reject"]["candidate_id"] == ids[1] and by_action["approve"]["candidate_id"] == ids[0]


def test_status_of_a_paused_run_reads_a_running_trial_s_own_folder(tmp_path):
    """A run paused at a review with a trial in flight: the trial runs on (its folder grows) while no tuner reads
    it, and `mart status` says what the folder holds rather than the ledger's last count; answering the review
    takes the trial in, without launching it again."""
    runs = str(tmp_path)
    # the embedded trainer: a real process, which outlives the tuner that exits at the review
    first = ok_json(cli("tune", "--backend", "local", "--parallel", "2", "--approve", "none", "--runs-dir", runs,
                        "--system-remeasure-share", "0.25",
                        "--system-trials", "2", "--learning-trials", "0", "--system-horizon", "3", "--json"))
    run = first["run_id"]
    store = RunStore.open(run, runs)
    (base,) = [t for t in Ledger.open(store.run_dir).trials() if t["status"] == "running"]
    assert base["kind"] == "baseline"  # the review for slot 2 came while the baseline ran
    done = store.run_dir / "trials" / base["trial_id"] / "status.json"
    deadline = time.monotonic() + 90
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert done.exists(), "the baseline did not end without its tuner"
    info = ok_json(cli("status", run, "--runs-dir", runs, "--json"))
    (row,) = info["running_trials"]
    assert row["steps_done"] < 3 and row["on_disk"] == {"steps": 3, "ended": "completed"}
    text = cli("status", run, "--runs-dir", runs)
    assert text.exit_code == 0
    assert f"trial {base['trial_id']} (baseline, system, slot 1): ended (completed), 3/3 steps in its folder" \
        in text.stdout

    nxt = ok_json(cli("review", run, "--runs-dir", runs, "--approve", "--detach", "--json", "-q"))
    assert nxt["status"] in ("paused", "completed")
    trials = Ledger.open(store.run_dir).trials()
    assert next(t for t in trials if t["trial_id"] == base["trial_id"])["status"] == "completed"
    assert sum(t["kind"] == "baseline" for t in trials) == 1 and len(trials) == 2  # taken in, not launched again
    assert len(Ledger.open(store.run_dir).metric_records(base["trial_id"])) == 3
