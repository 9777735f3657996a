"""kill -9 of the tuner, then `mart resume`: the session finishes, nothing runs twice.

Two places to die: while watching a running trial (local backend, a real trainer process that outlives the
tuner), and inside the launch node, after the handle reached the ledger but before the checkpoint saw it
(toy backend on its poll clock; its trial.log counts launches).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.oracles import assert_readme_shape, best_from_ledger
from tests.support.paths import REPO as REPO_ROOT
from tests.support.sessions import kill_with_two_running
from tests.support.sessions import run_dir as _run_dir
from tests.support.sessions import wait_for as _wait_for
from tests.support.toy_backend import START_LINE

REPO = REPO_ROOT
pytestmark = pytest.mark.slow


def _query(db: Path, sql: str, args=()):
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []


@pytest.mark.timeout(900)  # the waits below add up to 700 s; a loaded 2-core box needs them, an idle one ~1 min
@pytest.mark.parametrize("backend", ["local"])
def test_kill_minus_9_then_resume(tmp_path, backend):
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "mart.graph.cli", "tune", "--backend", backend, "--approve", "auto",
           # a candidate of stage 1 is killed, and stage 2 still has to run after the resume
           "--system-trials", "2", "--learning-trials", "1", "--system-horizon", "4", "--learning-horizon", "6",
           "--learning-confirm-trials", "0",  # stage-2 re-evaluations are tested in tests/nodes/test_learning_selection.py
           "--runs-dir", str(runs), "--quiet", "--json", "--system-remeasure-share", "0.25"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    tuner = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        run_dir = _wait_for(lambda: _run_dir(runs), 60, "the run directory")
        db = run_dir / "mart.sqlite"
        # kill the tuner while a *candidate* trial is running and has reported steps
        row = _wait_for(lambda: _query(db, "select t.trial_id, t.handle from trials t where t.kind='candidate' "
                                           "and t.status='running' and t.handle is not null and exists "
                                           "(select 1 from metrics m where m.trial_id=t.trial_id and m.step>=1)"),
                        240, "a running candidate trial")
        trial_id, handle = row[0][0], json.loads(row[0][1])
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait(10)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    # the trial outlives the tuner: it runs in its own process group
    import psutil

    assert psutil.pid_exists(handle["pid"])
    out = subprocess.run([sys.executable, "-m", "mart.graph.cli", "resume", run_dir.name, "--runs-dir", str(runs),
                          "--quiet", "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert_readme_shape(summary)
    assert {"notes", "agents"} <= set(summary)  # --json carries the notes and agent usage
    assert summary["status"] == "completed"
    assert summary["trials"]["total"] == 3
    rows = _query(db, "select trial_id, candidate_id, status, handle from trials")
    assert len(rows) == 3
    cands = [r[1] for r in rows if r[1]]
    assert len(cands) == len(set(cands)), "an approved candidate ran twice"
    killed = next(r for r in rows if r[0] == trial_id)
    assert killed[2] == "completed"
    assert json.loads(killed[3])["pid"] == handle["pid"], "the running trial was relaunched instead of re-attached"
    # the trial's own log: the trainer started once and logged each step once (no second process, no replay)
    [(trial_dir,)] = _query(db, "select trial_dir from trials where trial_id=?", (trial_id,))
    log = (Path(trial_dir) / "trial.log").read_text().splitlines()
    assert sum(line.startswith("local GRPO trial:") for line in log) == 1
    assert sum(line.startswith("step:0 ") for line in log) <= 1  # the validation before training, if any
    for step in range(1, 5):
        assert sum(line.startswith(f"step:{step} ") for line in log) == 1, (step, log)
    # the best is the ledger's best eligible trial, recomputed here
    trials = [dict(zip(("stage", "kind", "status", "early_stopped", "throughput", "score", "peak_memory_gb"), r))
              for r in _query(db, "select stage, kind, status, early_stopped, throughput, score, peak_memory_gb "
                                  "from trials")]
    best = best_from_ledger(trials, "system", summary["system"]["memory_limit_gb"])
    assert summary["system"]["best_throughput"] == pytest.approx(best["throughput"])


KILL_AT_LAUNCH = """
import os, signal, sys
import mart.graph.progress_console as progress_console
from mart.graph.cli import app

real = progress_console.ConsoleProgress.__call__

def die_after_the_handle(self, event):
    # the launch node emits trial_launched after the ledger holds the handle, before its output is checkpointed
    field = (lambda k: event.get(k)) if isinstance(event, dict) else (lambda k: getattr(event, k, None))
    if field("event") == "trial_launched" and field("kind") == "candidate":
        print("KILLED", field("trial_id"), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, event)

progress_console.ConsoleProgress.__call__ = die_after_the_handle
app(sys.argv[1:])
"""


def test_kill_minus_9_at_the_launch_node_then_resume(tmp_path):
    runs = tmp_path / "runs"
    toy = ["--backend", "tests.support.toy_backend:make_backend", "--backend-option", "stream=true"]
    cmd = [sys.executable, "-c", KILL_AT_LAUNCH, "tune", *toy, "--approve", "auto", "--system-trials", "3",
           "--learning-trials", "0", "--system-horizon", "5", "--runs-dir", str(runs), "--quiet", "--json",
           "--system-remeasure-share", "0.25"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    died = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
    trial_id = died.stdout.split("KILLED", 1)[1].split()[0]
    run_dir = _run_dir(runs)
    db = run_dir / "mart.sqlite"
    [(handle_at_kill, status_at_kill)] = _query(db, "select handle, status from trials where trial_id=?", (trial_id,))
    assert handle_at_kill and status_at_kill == "running"

    out = subprocess.run([sys.executable, "-m", "mart.graph.cli", "resume", run_dir.name, "--runs-dir", str(runs),
                          "--quiet", "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["status"] == "completed" and summary["trials"]["total"] == 3
    rows = _query(db, "select trial_id, status, handle, trial_dir, steps_done from trials")
    assert len(rows) == 3
    for tid, status, handle, trial_dir, steps in rows:
        log = (Path(trial_dir) / "trial.log").read_text().splitlines()
        assert sum(line.startswith(START_LINE) for line in log) == 1, (tid, log)  # one launch per trial
        assert status == "completed" and steps == 5
    killed = next(r for r in rows if r[0] == trial_id)
    assert json.loads(killed[2]) == json.loads(handle_at_kill), "the launched trial was launched again"


KILL_IN_THE_LAUNCH_WINDOW = """
import os, signal, sys
from mart.trial_runner import process
from mart.graph.cli import app

real = process.ProcessGroup.spawn.__func__

def spawn_then_die(cls, argv, **kw):
    group = real(cls, argv, **kw)  # the trainer is started, its handle is not saved anywhere yet
    if "--steps" in argv and any(a.startswith("lea-") or "/lea-" in a for a in argv):
        print("KILLED", group.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return group

process.ProcessGroup.spawn = classmethod(spawn_then_die)
app(sys.argv[1:])
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("resumed", ["at once", "after the trial ended"])
def test_kill_minus_9_inside_the_launch_window_adopts_the_started_trial(tmp_path, local_tiny_config, resumed):
    # issue 26 item 9: the worker was spawned, the tuner died before the ledger held its handle; a resume must
    # find that worker by the launch token recorded first, not start a second one; and when the orphan already
    # ran to its end (a reviewer resumes tomorrow), adopt its ending rather than run the trial again
    import psutil

    runs = tmp_path / "runs"
    sets = [a for k, v in local_tiny_config.items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-c", KILL_IN_THE_LAUNCH_WINDOW, "tune", "--backend", "local", "--approve", "auto",
           "--stages", "learning", "--learning-trials", "1", "--learning-horizon", "6", "--learning-confirm-trials",
           "0", *sets, "--runs-dir", str(runs), "--quiet", "--json"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    died = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
    pid = int(died.stdout.split("KILLED", 1)[1].split()[0])
    run_dir = _run_dir(runs)
    db = run_dir / "mart.sqlite"
    [(trial_id, handle, token)] = _query(db, "select trial_id, handle, launch_token from trials")
    assert handle is None and token, "the launch was recorded with its token before the spawn, not its handle"
    assert psutil.pid_exists(pid)
    if resumed == "after the trial ended":
        psutil.Process(pid).wait(timeout=240)
        assert json.loads((run_dir / "trials" / trial_id / "status.json").read_text())["status"] == "completed"
    out = subprocess.run([sys.executable, "-m", "mart.graph.cli", "resume", run_dir.name, "--runs-dir", str(runs),
                          "--quiet", "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["status"] == "completed"
    [(status, handle, trial_dir)] = _query(db, "select status, handle, trial_dir from trials")
    assert status == "completed"
    assert json.loads(handle)["pid"] == pid, "the trial was launched a second time instead of adopted"
    log = (Path(trial_dir) / "trial.log").read_text().splitlines()
    assert sum(line.startswith("local GRPO trial:") for line in log) == 1, log


@pytest.mark.timeout(900)
def test_kill_minus_9_with_two_trials_running_re_attaches_both(tmp_path, local_tiny_config):
    # --parallel 2 on the local workload: two trainer processes at once; the tuner dies while both run
    # trials long enough (60 steps) that two still run when the tuner has logged both's steps: at 12 an idle machine
    # finished the session before that moment
    runs = tmp_path / "runs"
    sets = [a for k, v in local_tiny_config.items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-m", "mart.graph.cli", "tune", "--backend", "local", "--approve", "auto", "--parallel", "2",
           "--stages", "learning", "--learning-trials", "3", "--learning-horizon", "60", "--learning-confirm-trials",
           "0", *sets, "--runs-dir", str(runs), "--quiet", "--json"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run_dir, at_kill = kill_with_two_running(cmd, runs, 400)
    db = run_dir / "mart.sqlite"
    import psutil

    assert all(psutil.pid_exists(h["pid"]) for h in at_kill.values())
    out = subprocess.run([sys.executable, "-m", "mart.graph.cli", "resume", run_dir.name, "--runs-dir", str(runs),
                          "--quiet", "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["status"] == "completed" and summary["trials"]["total"] == 3
    rows = {r[0]: r for r in _query(db, "select trial_id, status, handle, trial_dir, slot from trials")}
    assert len(rows) == 3
    for tid, handle in at_kill.items():
        assert rows[tid][1] == "completed"
        assert json.loads(rows[tid][2])["pid"] == handle["pid"], f"{tid} was relaunched instead of re-attached"
    for tid, status, _, trial_dir, _ in rows.values():
        log = (Path(trial_dir) / "trial.log").read_text().splitlines()
        assert sum(line.startswith("local GRPO trial:") for line in log) == 1, (tid, log)
    assert {rows[t][4] for t in at_kill} == {0, 1}  # the two held different slots
