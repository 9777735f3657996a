"""kill -9 of the tuner during a trial, then `mart resume`: the session finishes, nothing runs twice."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.paths import REPO as REPO_ROOT

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


def _wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("backend", ["local"])
def test_kill_minus_9_then_resume(tmp_path, backend):
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "mart.graph.cli", "tune", "--backend", backend, "--approve", "auto",
           "--system-trials", "3", "--learning-trials", "2", "--system-horizon", "4", "--learning-horizon", "6",
           "--learning-confirm-trials", "0",  # stage-2 re-evaluations are tested in tests/nodes/test_learning_selection.py
           "--runs-dir", str(runs), "--quiet", "--json"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    tuner = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        run_dir = _wait_for(lambda: next(iter(runs.glob("*/mart.sqlite")), None), 60, "the run directory").parent
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
    assert set(summary) == {"run_id", "status", "system", "learning", "trials", "notes", "agents"}
    assert summary["status"] == "completed"
    assert summary["trials"]["total"] == 5
    rows = _query(db, "select trial_id, candidate_id, status, handle from trials")
    assert len(rows) == 5
    cands = [r[1] for r in rows if r[1]]
    assert len(cands) == len(set(cands)), "an approved candidate ran twice"
    killed = next(r for r in rows if r[0] == trial_id)
    assert killed[2] == "completed"
    assert json.loads(killed[3])["pid"] == handle["pid"], "the running trial was relaunched instead of re-attached"
    steps = [s for (s,) in _query(db, "select distinct step from metrics where trial_id=? order by step", (trial_id,))]
    assert steps[-1] == 4 and steps == sorted(set(steps))
    assert summary["system"]["best_throughput"] >= summary["system"]["baseline_throughput"]
