"""One supervisor for a trial that runs as a detached process group: launch, liveness, SIGTERM -> grace -> SIGKILL.

A trial's processes belong to the trial, not to the tuner: ``ProcessGroup.spawn`` starts the command as
the leader of a new session (``start_new_session=True``, so a Ctrl-C or the tuner's death does not reach
it), and anyone holding its ``pid`` and create time - the runner that launched it, or a resumed tuner in
another process - can ask whether it still runs and stop it, children and grandchildren included.

Liveness follows one pid-reuse rule: a pid is the trial's only while the process holding it was created
within ``PID_REUSE_TOLERANCE_S`` of the recorded create time. psutil derives a create time from the boot
time plus the process's start ticks (https://psutil.readthedocs.io/en/latest/#psutil.Process.create_time),
and the boot time it reads moves when the wall clock is adjusted, so two readings of the same process in
different tuner processes can differ by up to about a second; a recycled pid within a second is not a
realistic case. Zombies count as gone (they have exited; only their exit status is left to reap).

The group outlives its leader when children keep running; ``alive`` and ``terminate`` cover the whole
group. Linux does not hand out a pid again while a process group still carries it as its id, so a live
process with the leader's pid and another create time proves that the trial's whole group is gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil

#: How far two readings of one process's create time may differ (see the module docstring).
PID_REUSE_TOLERANCE_S = 1.0

#: The environment of a child that runs one of mart's own modules: Python 3.11+ then puts neither the working
#: directory (``-m``) nor a script's folder first on ``sys.path``.
SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}


def python_command(python: str | None = None, *, safe_path: bool = True) -> list[str]:
    """An interpreter command: the interpreter as an absolute path (``python`` is looked up now, not by the
    child), and with ``safe_path`` ``-P`` (Python 3.11+) when it is this one, so that ``-m`` imports nothing
    from the working directory.

    A run folder is untrusted input, and ``python -m pkg`` puts its working directory first on ``sys.path``: a
    ``pkg/`` lying there would be imported instead of the installed package. (``-P`` also keeps a script's
    own folder off the path: a user's ``python train.py`` keeps it, with ``safe_path=False``.)
    """
    exe = python or sys.executable
    if not os.path.isabs(exe):
        exe = shutil.which(exe) or exe
    same = os.path.realpath(exe) == os.path.realpath(sys.executable)
    return [exe, "-P"] if safe_path and same and sys.version_info >= (3, 11) else [exe]


def private_workdir(parent: str | os.PathLike) -> Path:
    """A new, empty working directory for a trial process, made by mart now (a random name: nothing in a run
    folder can have been put there before). Python's ``-m`` and Ray both put the working directory on
    ``sys.path`` (Ray: every worker's, https://github.com/ray-project/ray/blob/master/python/ray/_private/worker.py),
    so it must hold only what the trial itself writes."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="cwd-", dir=parent))


def create_time(pid: int) -> float | None:
    """The create time of ``pid`` as psutil reports it (None when there is no such process)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def same_process(proc: psutil.Process, created: float | None) -> bool:
    """Whether ``proc`` is the process recorded with create time ``created`` (None: no guard recorded)."""
    if created is None:
        return True
    try:
        return abs(proc.create_time() - created) <= PID_REUSE_TOLERANCE_S
    except psutil.Error:
        return False


class ProcessGroup:
    """A trial's process group, led by ``pid`` (created at ``created``).

    Args:
        pid: the group leader's pid (also the group id when it was started by ``spawn``).
        created: the leader's create time, recorded at launch (``TrialHandle.pid_create_time``).
        popen: the ``Popen`` when this process started it: lets it reap the leader and read its exit code.
    """

    def __init__(self, pid: int, created: float | None = None, popen: subprocess.Popen | None = None) -> None:
        self.pid = pid
        self.created = created
        self.popen = popen

    def __repr__(self) -> str:
        return f"ProcessGroup(pid={self.pid}, created={self.created})"

    @classmethod
    def spawn(cls, argv: Sequence[str], *, cwd: str | os.PathLike | None = None,
              env: Mapping[str, str] | None = None, output: IO[bytes] | int | None = None) -> ProcessGroup:
        """Start ``argv`` as the leader of a new session, stdin closed, stdout+stderr to ``output``.

        Raises:
            OSError: the command cannot be started (not found, not executable).
        """
        popen = subprocess.Popen(list(argv), cwd=cwd, env=None if env is None else dict(env),
                                 stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        return cls(popen.pid, create_time(popen.pid), popen)

    # --- watching --------------------------------------------------------------------------------------
    @property
    def returncode(self) -> int | None:
        """The leader's exit code when this process started and reaped it (negative: killed by that signal)."""
        return None if self.popen is None else self.popen.poll()

    def _leader(self) -> psutil.Process | None:
        """The leader as a psutil process if the pid is still ours (dead or alive), else None."""
        try:
            proc = psutil.Process(self.pid)
        except psutil.Error:
            return None
        return proc if same_process(proc, self.created) else None

    def leader_alive(self) -> bool:
        """Is the leader itself still running (not exited, not a zombie, pid not recycled)?"""
        if self.popen is not None:
            if self.popen.poll() is not None:
                return False
            if not _is_zombie(self.pid):
                return True
            try:  # an exiting thread group shows as a zombie a few ms before it can be reaped
                self.popen.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            return False
        leader = self._leader()
        return leader is not None and not _is_zombie(leader.pid)

    def _leads_group(self) -> bool:
        try:
            return os.getpgid(self.pid) == self.pid
        except OSError:
            return False

    def members(self) -> list[psutil.Process]:
        """The live (non-zombie) processes of the trial's group, the leader included while it runs."""
        try:
            psutil.Process(self.pid)
            holder_exists = True
        except psutil.Error:
            holder_exists = False
        if holder_exists and self._leader() is None:
            return []  # the pid was handed out again, so the group it named is gone
        if holder_exists and not self._leads_group():
            return [psutil.Process(self.pid)] if self.leader_alive() else []  # not a group leader: itself only
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        out = []
        for proc in psutil.process_iter(["status"]):
            try:
                if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == self.pid:
                    out.append(proc)
            except (OSError, psutil.Error):
                continue
        return out

    def alive(self) -> bool:
        """Does any process of the trial's group still run?"""
        return self.leader_alive() or bool(self.members())

    # --- stopping --------------------------------------------------------------------------------------
    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole group (only to the leader if it leads no group); never to a recycled pid."""
        if self._leader() is None:
            if not self.members():
                return  # gone, or the pid now belongs to another process
        elif not self._leads_group():
            try:
                os.kill(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            return
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout_s: float, interval_s: float = 0.05) -> bool:
        """Wait up to ``timeout_s`` for the whole group to end; True when it has."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval_s)

    def terminate(self, grace_s: float = 5.0, kill_wait_s: float = 5.0) -> bool:
        """SIGTERM to the group, up to ``grace_s`` to exit, then SIGKILL; True once every process has ended."""
        if not self.alive():
            return True
        self.signal(signal.SIGTERM)
        if self.wait(grace_s):
            return True
        self.signal(signal.SIGKILL)
        return self.wait(kill_wait_s)


#: the environment variable carrying a trial's launch token (``TrialSpec.launch_token``) into its processes
LAUNCH_TOKEN_ENV = "MART_LAUNCH_TOKEN"


def launch_record() -> dict | None:
    """This process's launch token (set by the runner), pid and create time, for the file it writes when it ends
    (a local trial's ``status.json``, a verl supervisor's ``exit.json``): lets a resumed tuner that died inside the
    launch window adopt the trial's ending instead of launching it again (``base.finished_launch``)."""
    token = os.environ.get(LAUNCH_TOKEN_ENV)
    if not token:
        return None
    try:
        created: float | None = psutil.Process(os.getpid()).create_time()
    except psutil.Error:  # the create time only guards against pid reuse; the pid alone still helps
        created = None
    return {"token": token, "pid": os.getpid(), "created": created}


def find_launched(token: str, *, settle_s: float = 2.0) -> ProcessGroup | None:
    """The process group a launch with ``token`` started (its leader: the process carrying the token in its
    environment that leads its own group), or None. A tuner killed between spawning a trial and saving its handle
    finds it again here instead of starting a second one. ``settle_s``: how long to look again for a child that
    was still being exec'd when the tuner died."""
    deadline = time.monotonic() + settle_s
    while True:
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(LAUNCH_TOKEN_ENV) != token:
                    continue
                if os.getpgid(proc.pid) == proc.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    return ProcessGroup(proc.pid, proc.create_time())
            except (psutil.Error, OSError):
                continue
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


#: how long to wait for a just-spawned process's command line and environment to appear in /proc
EXEC_SETTLE_S = 1.0

#: how much earlier than the recorded launch time a launched process's create time may read: psutil's create time
#: moves with the boot-time estimate (module docstring) and a loaded machine reads both clocks late; a process
#: running from long before the launch (a victim named by a planted handle) is still told apart
LAUNCH_CLOCK_SLACK_S = 5.0


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _why_not_launched(proc: psutil.Process, token: str | None, launched_at: float | None,
                      modules: Sequence[str], leader: bool) -> str | None:
    """Why ``proc`` is not a process a mart launch started (None: it is)."""
    deadline = time.monotonic() + EXEC_SETTLE_S
    while not _cmdline(proc) and time.monotonic() < deadline:
        # just spawned: the parent resumes inside the child's execve, before its arguments and environment are in
        # place (/proc shows neither for a few ms); a real process has a command line
        time.sleep(0.01)
    try:
        env = proc.environ()
    except psutil.AccessDenied:
        return f"pid {proc.pid} belongs to another user (its environment cannot be read)"
    except psutil.Error:
        return None  # it has just ended: nothing left to signal
    carried = env.get(LAUNCH_TOKEN_ENV)
    if not carried or (token is not None and carried != token):
        return f"pid {proc.pid} ({' '.join(_cmdline(proc))[:80]!r}) does not carry the row's launch token"
    if leader and modules:
        argv = _cmdline(proc)
        if not any(a == "-m" and i + 1 < len(argv) and argv[i + 1] in modules for i, a in enumerate(argv)):
            return f"pid {proc.pid} is not a mart supervisor or worker ({' '.join(argv)[:80]!r})"
    if leader and launched_at:
        try:
            if proc.create_time() < float(launched_at) - LAUNCH_CLOCK_SLACK_S:
                return f"pid {proc.pid} started before the trial was launched"
        except psutil.Error:
            return None
    return None


def unproven_launch(pid: int, created: float | None, token: str | None, launched_at: float | None = None,
                    modules: Sequence[str] = ()) -> str | None:
    """Why mart cannot prove that a launch started the process group ``pid`` names, or None when it can (or when
    nothing of that group runs any more, so there is nothing to signal).

    A stored handle (a ledger row, a ``launch.json``) is untrusted input: anyone who can write a run folder can
    put any pid and create time there (both readable in ``/proc``). The proof is the process itself: the leader
    carries the launch's token in its environment (``token``; None: any mart launch token), runs one of
    ``modules`` (``python -m MODULE``: mart's supervisor or worker) and started after ``launched_at``; when the
    leader is gone, every process left in its group carries the token."""
    try:
        proc: psutil.Process | None = psutil.Process(pid)
    except psutil.Error:
        proc = None
    if proc is not None:
        if created is not None and not same_process(proc, created):
            return None  # the pid was handed out again: the group it named is gone and is never signalled
        if not _is_zombie(pid):
            return _why_not_launched(proc, token, launched_at, modules, leader=True)
    for member in ProcessGroup(pid, created).members():
        if member.pid != pid and (why := _why_not_launched(member, token, None, (), leader=False)):
            return why
    return None


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
