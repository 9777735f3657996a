"""Driving a real ``mart tune`` process in tests: wait on its ledger (read-only), and kill -9 it mid-batch."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.paths import REPO


def wait_for(pred, timeout: float, what: str):
    """``pred()``'s first truthy value within ``timeout`` seconds (polled), else AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def query(db: Path, sql: str) -> list[dict]:
    """Rows of ``sql`` on a run's database, read-only ([] while it cannot be read: a run being created)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute(sql).fetchall()]
        finally:
            conn.close()
    except sqlite3.Error:
        return []


def run_dir(runs: Path) -> Path | None:
    """The run folder once it is in place (a run is built under a hidden name, then renamed)."""
    return next((p.parent for p in runs.glob("*/mart.sqlite") if not p.parent.name.startswith(".")), None)


def kill_with_two_running(cmd: list[str], runs: Path, timeout: float) -> tuple[Path, dict[str, dict]]:
    """Start ``cmd`` (a ``mart tune --parallel 2`` writing to ``runs``), kill -9 it once two trials run and have
    reported a training step; (the run folder, each of those trials' handle at the kill)."""
    # its output goes to a file, not a pipe nobody reads (a full pipe would block the tuner mid-session)
    out = tempfile.TemporaryFile()
    tuner = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=out,
                             stderr=subprocess.STDOUT)

    def alive(value):
        if not value and tuner.poll() is not None:  # it ended before the moment to kill it: say why, at once
            out.seek(0)
            raise AssertionError(f"the tuner exited ({tuner.returncode}) first: {out.read()[-3000:]!r}")
        return value

    try:
        where = wait_for(lambda: alive(run_dir(runs)), 60, "the run directory")
        rows = wait_for(lambda: alive((lambda rows: rows if len(rows) >= 2 else None)(query(
            where / "mart.sqlite", "select t.trial_id, t.handle from trials t where t.status='running' and t.handle "
            "is not null and exists (select 1 from metrics m where m.trial_id=t.trial_id and m.step>=1)"))), timeout,
            "two running trials with steps")
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait(10)
    finally:
        if tuner.poll() is None:
            tuner.kill()
        out.close()
    return where, {r["trial_id"]: json.loads(r["handle"]) for r in rows}
