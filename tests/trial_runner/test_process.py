"""The trial process supervisor: a detached group, one pid-reuse rule, SIGTERM -> grace -> SIGKILL of the group."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from mart.trial_runner.process import PID_REUSE_TOLERANCE_S, ProcessGroup

IGNORES_TERM = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(120)
""")

# the child starts a grandchild (its own python, same group) and records the grandchild's pid
WITH_GRANDCHILD = textwrap.dedent("""
    import subprocess, sys, time
    gc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(sys.argv[1], "w").write(str(gc.pid))
    print("ready", flush=True)
    if sys.argv[2] == "exit":
        sys.exit(0)  # the leader leaves; its grandchild keeps the group alive
    time.sleep(120)
""")


def _wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def groups():
    """Groups started by a test; whatever is left is killed at the end."""
    started: list[ProcessGroup] = []
    yield started
    for g in started:
        g.terminate(grace_s=0.1)


def _spawn(groups, tmp_path: Path, code: str, *args: str) -> ProcessGroup:
    log = tmp_path / "out.log"
    with open(log, "ab") as out:
        g = ProcessGroup.spawn([sys.executable, "-c", code, *args], output=out)
    groups.append(g)
    _wait_for(lambda: "ready" in log.read_text())
    return g


def test_spawn_detaches_into_a_group_of_its_own(groups, tmp_path: Path) -> None:
    g = _spawn(groups, tmp_path, IGNORES_TERM)
    proc = psutil.Process(g.pid)
    assert g.created == pytest.approx(proc.create_time())
    assert os.getpgid(g.pid) == g.pid != os.getpgid(0)  # its own group and session, not the tuner's
    assert os.getsid(g.pid) == g.pid
    assert g.leader_alive() and g.alive() and [p.pid for p in g.members()] == [g.pid]


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(groups, tmp_path: Path) -> None:
    g = _spawn(groups, tmp_path, IGNORES_TERM)
    t0 = time.monotonic()
    assert g.terminate(grace_s=0.6, kill_wait_s=5.0)
    elapsed = time.monotonic() - t0
    assert 0.6 <= elapsed < 5.0  # it waited the whole grace (SIGTERM was ignored), then SIGKILL worked
    assert g.returncode == -signal.SIGKILL
    assert not g.alive()


def test_a_grandchild_of_the_group_dies_too(groups, tmp_path: Path) -> None:
    pid_file = tmp_path / "gc.pid"
    g = _spawn(groups, tmp_path, WITH_GRANDCHILD, str(pid_file), "stay")
    grandchild = int(pid_file.read_text())
    assert grandchild in {p.pid for p in g.members()}
    assert g.terminate(grace_s=2.0)
    _wait_for(lambda: _gone(grandchild), 5.0)
    assert g.returncode == -signal.SIGTERM


def test_the_group_outlives_its_leader_and_is_stopped_from_another_process(groups, tmp_path: Path) -> None:
    pid_file = tmp_path / "gc.pid"
    g = _spawn(groups, tmp_path, WITH_GRANDCHILD, str(pid_file), "exit")
    grandchild = int(pid_file.read_text())
    _wait_for(lambda: not g.leader_alive())
    assert g.returncode == 0
    # a resumed tuner knows only the handle: pid and create time
    attached = ProcessGroup(g.pid, g.created)
    assert not attached.leader_alive()
    assert attached.alive() and [p.pid for p in attached.members()] == [grandchild]
    assert attached.terminate(grace_s=2.0)
    _wait_for(lambda: _gone(grandchild), 5.0)
    assert not attached.alive()


def test_a_reused_pid_is_not_the_trial(groups, tmp_path: Path) -> None:
    g = _spawn(groups, tmp_path, IGNORES_TERM)
    # the same pid recorded with another create time: the process holding it now is someone else's
    stranger = ProcessGroup(g.pid, g.created - 10 * PID_REUSE_TOLERANCE_S)
    assert not stranger.leader_alive() and not stranger.alive() and stranger.members() == []
    assert stranger.terminate(grace_s=0.1)  # "already gone": nothing is signalled
    stranger.signal(signal.SIGKILL)
    time.sleep(0.2)
    assert g.leader_alive(), "a process that merely reuses the pid must never be signalled"
    # within the tolerance it is the same process (create times read in two processes may differ slightly)
    assert ProcessGroup(g.pid, g.created + PID_REUSE_TOLERANCE_S / 2).alive()
    assert ProcessGroup(g.pid, None).alive()  # no guard recorded: the pid alone


def test_a_pid_that_no_longer_exists_is_gone(groups, tmp_path: Path) -> None:
    g = _spawn(groups, tmp_path, IGNORES_TERM)
    g.signal(signal.SIGKILL)
    _wait_for(lambda: not g.alive())
    ghost = ProcessGroup(g.pid, g.created)
    assert not ghost.alive() and ghost.members() == [] and ghost.terminate(grace_s=0.1)


def test_a_command_that_cannot_start_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        ProcessGroup.spawn([str(tmp_path / "no-such-program")])
