"""What a test started is ended when it fails: trial processes, tuners and servers working in its folder.

A test that kills a tuner (kill -9) or freezes a trial (SIGSTOP) and then fails an assertion leaves processes that
outlive it: trials run in their own process groups, and a frozen one never ends. ``reap`` ends
the processes this test started, known two ways, each proof that the test started them:

- the trials the ledgers under ``root`` recorded: a handle's pid *with its create time* (a recycled pid is never
  signalled), or a launch token found in a process's environment (a kill inside the launch window);
- a process started since the test began whose command line names ``root`` (a trial's ``--out``, a tuner's
  ``--runs-dir``, a server's folder): ``root`` is this test's own ``tmp_path``, which nothing else names.

Nothing else is touched: a test running beside it in another worker has its own folder.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import psutil

from mart.trial_runner.process import ProcessGroup, find_launched


def _trial_rows(db: Path) -> list[tuple[str | None, str | None]]:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute("SELECT handle, launch_token FROM trials").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:  # no trials table yet, or not a ledger
        return []


def recorded_groups(root: Path) -> list[ProcessGroup]:
    """The process groups of the trials that the ledgers under ``root`` recorded and that still run."""
    groups: list[ProcessGroup] = []
    for db in root.rglob("mart.sqlite"):
        for handle, token in _trial_rows(db):
            try:
                h = json.loads(handle) if handle else {}
            except ValueError:
                h = {}
            if h.get("pid"):
                group = ProcessGroup(int(h["pid"]), h.get("pid_create_time"))
                if group.alive():  # the recorded process (``alive`` never counts a reused pid)
                    groups.append(group)
            elif token:
                found = find_launched(token, settle_s=0.0)
                if found is not None:
                    groups.append(found)
    return groups


def started_in(root: Path, since: float, pids: set[int]) -> list[ProcessGroup]:
    """Of ``pids`` (the processes that appeared during the test), those started at or after ``since`` whose command
    line names ``root`` (this process and its parents excluded), as the groups they lead, else themselves."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    needle = str(root)  # whole: the folder test_x1 is no prefix match of a sibling test's test_x10
    out = []
    for pid in sorted(pids - mine):
        try:
            proc = psutil.Process(pid)
            created = proc.create_time()
            if created < since or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(arg == needle or arg.endswith("=" + needle) or needle + os.sep in arg for arg in proc.cmdline()):
                out.append(ProcessGroup(pid, created))
        except (psutil.Error, OSError):
            continue
    return out


def reap(root: Path, since: float, before: set[int]) -> list[int]:
    """End what ``root``'s test started that still runs (``since``: when it began, ``before``: the pids then); a
    frozen process is continued first, so that it can take the SIGTERM. The pids it ended."""
    ended = []
    for group in [*recorded_groups(root), *started_in(root, since, set(psutil.pids()) - before)]:
        if not group.alive():
            continue
        group.signal(signal.SIGCONT)
        group.terminate(grace_s=2.0, kill_wait_s=5.0)
        ended.append(group.pid)
    return ended
