"""kill -9 of the tuner in the middle of a schedule tree, then `mart resume`: the tree is finished, no branch runs
twice, a running branch is re-attached (the simulator on its poll clock: a trial advances only when polled,
so it waits for the resumed tuner exactly as a real job would keep running)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from mart.state.options import TuneOptions
from tests.graph.test_crash_resume import _query, _run_dir, _wait_for
from tests.graph.test_schedule_stage import check_tree
from tests.support.paths import REPO

ARGS = ["tune", "--backend", "sim", "--backend-option", "clock=poll", "--approve", "auto", "--stages", "schedule",
        "--learning-horizon", "12", "--schedule-segments", "3", "--schedule-branches", "3", "--watch-interval-s",
        "0.2", "--quiet", "--json", "--no-report"]
OPTIONS = TuneOptions(stages=["schedule"], learning_horizon=12, schedule_segments=3, schedule_branches=3)

KILL_AT_LAUNCH = """
import os, signal, sys
import mart.graph.progress_console as progress_console
from mart.graph.cli import app

real = progress_console.ConsoleProgress.__call__

def die_after_the_handle(self, event):
    # a transition branch's launch: the ledger holds its handle, the graph's checkpoint does not yet
    field = (lambda k: event.get(k)) if isinstance(event, dict) else (lambda k: getattr(event, k, None))
    if field("event") == "trial_launched" and field("stage") == "schedule" and field("changes"):
        print("KILLED", field("trial_id"), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, event)

progress_console.ConsoleProgress.__call__ = die_after_the_handle
app(sys.argv[1:])
"""


def _resume(run_dir: Path, runs: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "mart.graph.cli", "resume", run_dir.name, "--runs-dir", str(runs),
                          "--quiet", "--json"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _rows(db: Path) -> list[dict]:
    cols = ("trial_id", "kind", "candidate_id", "status", "handle", "trial_dir", "parent_trial", "parent_step",
            "parent_checkpoint", "horizon", "confirms", "overrides", "config")
    return [dict(zip(cols, r)) for r in _query(db, f"select {', '.join(cols)} from trials order by seq")]


def _check_finished_tree(db: Path, summary: dict) -> list[dict]:
    assert summary["status"] == "completed" and summary["schedule"]["winner"]
    rows = _rows(db)
    for r in rows:
        r["overrides"], r["config"] = json.loads(r["overrides"] or "{}"), json.loads(r["config"])
    check_tree(rows, OPTIONS)
    assert len(rows) <= OPTIONS.schedule_trial_budget()
    cands = [r["candidate_id"] for r in rows if r["candidate_id"]]
    assert len(cands) == len(set(cands)), "an approved transition ran twice"
    assert all(r["status"] != "running" for r in rows)
    for r in rows:  # one launch per trial: the simulator writes its plan once, at launch
        meta = json.loads((Path(r["trial_dir"]) / "sim_trial.json").read_text())
        assert meta["started_at"] == json.loads(r["handle"])["started_at"], r["trial_id"]
    return rows


def test_kill_minus_9_while_a_branch_runs_then_resume(tmp_path):
    runs = tmp_path / "runs"
    tuner = subprocess.Popen([sys.executable, "-m", "mart.graph.cli", *ARGS, "--runs-dir", str(runs)], cwd=REPO,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        run_dir = _wait_for(lambda: _run_dir(runs), 60, "the run directory")
        db = run_dir / "mart.sqlite"
        row = _wait_for(lambda: _query(db, "select t.trial_id, t.handle from trials t where t.parent_trial is not null "
                                           "and t.status='running' and t.handle is not null and exists (select 1 from "
                                           "metrics m where m.trial_id=t.trial_id and m.step>t.parent_step)"),
                        120, "a running branch")
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait(10)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    trial_id, handle = row[0][0], json.loads(row[0][1])
    summary = _resume(run_dir, runs)
    rows = _check_finished_tree(db, summary)
    killed = next(r for r in rows if r["trial_id"] == trial_id)
    assert killed["status"] == "completed"
    assert json.loads(killed["handle"]) == handle, "the running branch was relaunched instead of re-attached"


def test_kill_minus_9_at_a_branch_launch_then_resume(tmp_path):
    runs = tmp_path / "runs"
    died = subprocess.run([sys.executable, "-c", KILL_AT_LAUNCH, *ARGS, "--runs-dir", str(runs)], cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=120)
    assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
    trial_id = died.stdout.split("KILLED", 1)[1].split()[0]
    run_dir = _run_dir(runs)
    db = run_dir / "mart.sqlite"
    [(handle_at_kill, parent)] = _query(db, "select handle, parent_trial from trials where trial_id=?", (trial_id,))
    assert handle_at_kill and parent, "the branch reached the ledger with its handle and its parent"
    summary = _resume(run_dir, runs)
    rows = _check_finished_tree(db, summary)
    killed = next(r for r in rows if r["trial_id"] == trial_id)
    assert json.loads(killed["handle"]) == json.loads(handle_at_kill), "the launched branch was launched again"
    assert killed["parent_trial"] == parent
