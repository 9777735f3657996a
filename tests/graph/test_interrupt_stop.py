"""Ctrl-C, SIGTERM and `mart stop`: a stopped tuner names the trials that run on (pid, folder) and how to re-attach
them; a second Ctrl-C or `mart stop RUN` stops them; only a process that carries the trial's launch token is ever
signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from mart.graph.stop import InFlight, proven_group
from mart.trial_runner.process import LAUNCH_TOKEN_ENV, create_time
from tests.support.paths import REPO
from tests.support.sessions import query, run_dir, wait_for


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _start_tuner(runs: Path):
    err = tempfile.NamedTemporaryFile(delete=False, suffix=".err")
    cmd = [sys.executable, "-m", "mart.graph.cli", "tune", "--backend", "local", "--approve", "auto",
           "--system-trials", "2", "--learning-trials", "0", "--system-horizon", "200", "--runs-dir", str(runs),
           "--no-report"]
    tuner = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL,
                             stderr=err)
    folder = wait_for(lambda: run_dir(runs), 60, "the run folder")
    trial = wait_for(lambda: query(folder / "mart.sqlite", "select t.trial_id, t.handle from trials t where "
                                   "t.status='running' and t.handle is not null and exists (select 1 from metrics m "
                                   "where m.trial_id=t.trial_id)"), 240, "a running trial with a step")[0]
    import json

    return tuner, Path(err.name), folder, trial["trial_id"], json.loads(trial["handle"])["pid"]


def _stderr_with(path: Path, text: str, timeout: float) -> str:
    return wait_for(lambda: (lambda s: s if text in s else None)(path.read_text()), timeout, repr(text))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_names_the_running_trial_and_a_second_one_stops_it(tmp_path):
    runs = tmp_path / "runs"
    tuner, err, folder, trial_id, pid = _start_tuner(runs)
    try:
        tuner.send_signal(signal.SIGINT)
        said = _stderr_with(err, "Ctrl-C again", 120)
        line = [x for x in said.splitlines() if "Ctrl-C again" in x][0]
        assert f"{trial_id} (pid {pid}, {folder / 'trials' / trial_id})" in line
        assert f"`mart resume {folder.name} --runs-dir {runs}` re-attaches them" in line
        assert not _gone(pid)  # the first Ctrl-C stops the tuner only
        tuner.send_signal(signal.SIGINT)
        assert tuner.wait(60) == 130
    finally:
        if tuner.poll() is None:
            tuner.kill()
    assert f"{trial_id}: stopped (pid {pid})" in err.read_text()
    assert wait_for(lambda: _gone(pid), 30, "the trial's end")
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(folder) in " ".join(p.info["cmdline"] or [])
                and not _gone(p.pid)]  # no process of the run is left


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_prints_one_line_and_mart_stop_ends_the_trials(tmp_path):
    runs = tmp_path / "runs"
    tuner, err, folder, trial_id, pid = _start_tuner(runs)
    try:
        tuner.send_signal(signal.SIGTERM)
        assert tuner.wait(120) == 128 + signal.SIGTERM  # no second signal to wait for
    finally:
        if tuner.poll() is None:
            tuner.kill()
    said = [x for x in err.read_text().splitlines() if "SIGTERM" in x]
    assert len(said) == 1 and f"{trial_id} (pid {pid}," in said[0] and f"`mart stop {folder.name} --runs-dir {runs}`" \
        in said[0]
    assert not _gone(pid)
    # a `mart resume` that re-attached the trial, then got SIGTERM, says so in one line too
    err2 = Path(tempfile.NamedTemporaryFile(delete=False, suffix=".err").name)
    with err2.open("wb") as sink:
        resumed = subprocess.Popen([sys.executable, "-m", "mart.graph.cli", "resume", folder.name, "--runs-dir",
                                    str(runs)], cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                   stdout=subprocess.DEVNULL, stderr=sink)
    try:
        _stderr_with(err2, f"{trial_id}", 120)  # re-attached (or already stepping on)
        resumed.send_signal(signal.SIGTERM)
        assert resumed.wait(120) == 128 + signal.SIGTERM
    finally:
        if resumed.poll() is None:
            resumed.kill()
    said = [x for x in err2.read_text().splitlines() if "SIGTERM" in x]
    assert len(said) == 1 and f"`mart resume {folder.name} --runs-dir {runs}` re-attaches" in said[0], said
    assert not _gone(pid)  # the same trial, still running: nothing was launched twice
    out = subprocess.run([sys.executable, "-m", "mart.graph.cli", "stop", folder.name, "--runs-dir", str(runs)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{trial_id}: stopped (pid {pid})" in out.stdout
    assert wait_for(lambda: _gone(pid), 30, "the trial's end")


def _session_sleeper(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)


def test_only_a_process_carrying_the_launch_token_is_proven():
    mine = _session_sleeper({**os.environ, LAUNCH_TOKEN_ENV: "tok-1"})
    victim = _session_sleeper({k: v for k, v in os.environ.items() if k != LAUNCH_TOKEN_ENV})
    try:
        time.sleep(0.3)

        def row(p, token):
            return InFlight(trial_id="t", folder="f", pid=p.pid, created=create_time(p.pid), token=token, job_id=None)

        assert proven_group(row(mine, "tok-1"))[0] is not None
        # a ledger row naming another process (its pid and start time are public) proves nothing
        group, why = proven_group(row(victim, "tok-1"))
        assert group is None and "launch token" in why
        assert proven_group(row(mine, "tok-2"))[0] is None  # another trial's token
        assert proven_group(row(mine, None))[0] is None  # no token recorded: not provable
        assert mine.poll() is None and victim.poll() is None  # nothing was signalled
    finally:
        mine.kill()
        victim.kill()
        mine.wait()
        victim.wait()


def test_mart_stop_leaves_a_planted_pid_alone(tmp_path):
    """A run folder's ledger naming another process (pid and start time are public) never gets it signalled."""
    from mart.state.ledger import Ledger
    from tests.support.cli import cli, paused_toy_run

    runs = tmp_path / "runs"
    run = paused_toy_run(str(runs))["run_id"]
    victim = _session_sleeper({k: v for k, v in os.environ.items() if k != LAUNCH_TOKEN_ENV})
    try:
        ledger = Ledger(runs / run / "mart.sqlite")
        trial_id = ledger.trials()[0]["trial_id"]
        ledger.set_trial_fields(trial_id, status="running", launch_token="0123456789abcdef",
                                handle={"trial_id": trial_id, "backend": "local", "trial_dir": str(runs / run),
                                        "pid": victim.pid, "pid_create_time": create_time(victim.pid)})
        ledger.close()
        out = cli("stop", run, "--runs-dir", str(runs))
        assert out.exit_code == 1 and f"{trial_id}: pid {victim.pid} (" in out.output \
            and "does not carry the row's launch token; left alone" in out.output, out.output
        time.sleep(0.5)
        assert victim.poll() is None  # alive
    finally:
        victim.kill()
        victim.wait()
