"""Several trials at once on a real local Ray head (the head fixture of test_ray_jobs.py: 127.0.0.1, token auth as
Ray 2.60 sets it, 2 CPUs): each trial one Ray job with its own reservation, the cluster's capacity read from its
nodes, a job waiting for resources reported as queued (not failed, not timed out), and a kill -9 of mart with two
jobs running, then ``mart resume``, re-attaching both.

Oracles: the head's resources are what the fixture started it with; what Ray was asked for is read back from Ray
(the job supervisor actor's ``required_resources`` in the state API, ``list_jobs``); trial intervals and slots come from ``mart trials --json``. A "blocker" job
(another user of the cluster) holds its CPUs so that mart's trials must wait.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.job_submission", reason="ray[default] not installed: pip install 'mart[ray]'")

from mart.state.trials import TrialSpec
from mart.trial_runner.local.config import TINY_CONFIG
from mart.trial_runner.ray.runner import submit_with_retry
from mart.trial_runner.registry import load_backend
from tests.support.paths import FAKE_VERL, REPO
from tests.support.sessions import kill_with_two_running, query, wait_for
from tests.support.sessions import run_dir as run_folder
from tests.support.trials import wait_finished
from tests.trial_runner.test_ray_jobs import ray_head  # noqa: F401 - the module-scoped head fixture (2 CPUs)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

HEAD_CPUS = 2  # what the fixture starts the head with (--num-cpus=2)
QUEUED = "queued (waiting for cluster resources)"
SETS = [a for k, v in TINY_CONFIG.items() for a in ("--set", f"{k}={v}")]


def _client(address: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address, headers={"Authorization": f"Bearer {os.environ['RAY_AUTH_TOKEN']}"})


def _mart(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mart.graph.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _jobs_of(client, trial_dir: str) -> list[str]:
    """The submission ids of every job the cluster was given for the trial in ``trial_dir``."""
    return [j.submission_id for j in client.list_jobs() if (j.metadata or {}).get("mart_trial_dir") == trial_dir]


def _reserved(address: str, submission_id: str) -> dict[str, float]:
    """What Ray reserves for the job's driver: the resources of the actor that runs its entrypoint (Ray's job
    supervisor, ``_ray_internal_job_actor_<submission id>``), read from the state API."""
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    state = StateApiClient(address=address, headers={"Authorization": f"Bearer {os.environ['RAY_AUTH_TOKEN']}"})
    options = ListApiOptions(detail=True, filters=[("name", "=", f"_ray_internal_job_actor_{submission_id}")])
    # the supervisor is registered with Ray's control store a moment after the submission returns
    actor = wait_for(lambda: next(iter(state.list(StateResource.ACTORS, options=options,
                                                  raise_on_missing_output=False)), None), 30, "the job's supervisor")
    return dict((actor.get("required_resources") if isinstance(actor, dict) else actor.required_resources) or {})


class Blocker:
    """Another user's job holding ``cpus`` of the head's CPUs until stopped."""

    def __init__(self, address: str, cpus: int) -> None:
        self.client = _client(address)
        self.id = submit_with_retry(self.client, entrypoint="sleep 900", entrypoint_num_cpus=cpus,
                                    submission_id=f"blocker-{secrets.token_hex(4)}")
        wait_for(lambda: self.client.get_job_status(self.id).value == "RUNNING", 60, "the blocker to run")

    def stop(self) -> None:
        self.client.stop_job(self.id)
        wait_for(lambda: self.client.get_job_status(self.id).is_terminal(), 60, "the blocker to stop")


def test_capacity_is_read_from_the_cluster_over_one_trials_reservation(ray_head):  # noqa: F811
    local = load_backend("local", ray_address=ray_head)
    assert local.max_parallel_trials() == HEAD_CPUS  # one CPU per trainer thread by default
    assert local.parallel_limit_reason() == f"{HEAD_CPUS} CPUs on 1 node(s), 1 per trial"
    wide = load_backend("local", ray_address=ray_head, entrypoint_num_cpus=2)
    assert wide.max_parallel_trials() == 1 and wide.parallel_limit_reason().endswith("2 per trial")
    # a custom resource the head does not have: no trial fits now, one slot, and the reason says Ray queues it
    gated = load_backend("local", ray_address=ray_head, entrypoint_resources={"mart_trial": 1})
    assert gated.max_parallel_trials() == 1
    assert gated.parallel_limit_reason().startswith("0 'mart_trial' on 0 node(s), 1 per trial: none fits now")
    # verl asks for trainer.nnodes x trainer.n_gpus_per_node GPUs itself: a head without GPUs holds none
    verl = load_backend("verl", entrypoint=f"{sys.executable} {FAKE_VERL}", ray_address=ray_head,
                        base_config={"trainer.n_gpus_per_node": 4, "trainer.nnodes": 1})
    assert verl.parallel_limit_reason() == "0 GPUs on 0 node(s), 4 per trial: none fits now, Ray queues the trial " \
                                           "until one does"
    # a cluster that cannot be read: unknown (None), said as a warning
    with pytest.warns(UserWarning, match="could not be read"):
        assert load_backend("local", ray_address="http://127.0.0.1:9").max_parallel_trials() is None


def test_a_pending_job_is_queued_and_its_first_step_clock_waits(ray_head, tmp_path):  # noqa: F811
    """The verl runner's own watchdog (it watches its jobs in ``poll``): a job in Ray's queue longer than the
    first-step timeout is not killed as hung, and the driver's reservation reached Ray."""
    from mart.trial_runner.verl import VerlBackend, WatchdogConfig

    blocker = Blocker(ray_head, HEAD_CPUS)
    try:
        backend = VerlBackend(entrypoint=f"{sys.executable} {FAKE_VERL}", ray_address=ray_head, prevalidate=False,
                              base_config={"fake.step_s": 0.05}, entrypoint_num_cpus=1,
                              watchdog=WatchdogConfig(first_step_timeout_s=4, k=3, min_step_timeout_s=2))
        runner = backend.make_runner()
        assert runner.watches_progress
        handle = runner.launch(TrialSpec(trial_id="ray-queued", config=backend.base_config(), steps=4,
                                         trial_dir=str(tmp_path / "q")))
        assert _reserved(ray_head, handle.job_id) == {"CPU": 1}
        deadline = time.monotonic() + 7  # longer than the first-step timeout
        while time.monotonic() < deadline:
            poll = runner.poll(handle)
            assert poll.status.value == "running" and poll.queued == "waiting for cluster resources", poll
            time.sleep(0.5)
    finally:
        blocker.stop()
    final = wait_finished(runner, handle, 120, every_s=0.5)
    assert final.status.value == "completed" and final.last_step == 4, final
    assert _jobs_of(runner.client, handle.trial_dir) == [handle.job_id]


def test_two_trials_as_ray_jobs_at_once_and_a_kill_minus_9_re_attaches_both(ray_head, tmp_path):  # noqa: F811
    runs = tmp_path / "runs"
    client = _client(ray_head)
    # 24 steps, not fewer: under the full suite's load two jobs' starts can lie seconds apart, and with 12 steps one
    # ended before the other logged its first step (the tuner then finished before there was a moment to kill it)
    cmd = [sys.executable, "-m", "mart.graph.cli", "tune", "--backend", "local", "--ray-address", ray_head,
           "--approve", "auto", "--parallel", "2", "--stages", "learning", "--learning-trials", "3",
           "--learning-horizon", "24", "--learning-confirm-trials", "0", *SETS, "--runs-dir", str(runs), "--quiet",
           "--json"]
    where, handles = kill_with_two_running(cmd, runs, 300)
    at_kill = {tid: h["job_id"] for tid, h in handles.items()}
    # the jobs belong to the cluster: they run on without the tuner (none stopped or failed with it; on a loaded box
    # one may already have finished: the ledger's steps lag the job's, so "running" there can be its last step)
    statuses = {client.get_job_status(j).value for j in at_kill.values()}
    assert statuses <= {"RUNNING", "SUCCEEDED"}, statuses
    # the run folder's cluster address is not trusted on its own: the user names it again
    out = _mart("resume", where.name, "--runs-dir", str(runs), "--ray-address", ray_head, "--quiet", "--json",
                timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["status"] == "completed" and summary["trials"]["total"] == 3 and summary["trials"]["failed"] == 0

    listed = _mart("trials", where.name, "--runs-dir", str(runs), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["trial_id"]: r for r in json.loads(listed.stdout)}
    assert len(rows) == 3 and {r["status"] for r in rows.values()} == {"completed"}
    for tid, job_id in at_kill.items():
        assert rows[tid]["handle"]["job_id"] == job_id, f"{tid} was submitted again instead of re-attached"
    for tid in rows:  # every trial is one Ray job, submitted once, with its reservation
        jobs = _jobs_of(client, str(Path(rows[tid]["trial_dir"]).resolve()))
        assert jobs == [rows[tid]["handle"]["job_id"]], (tid, jobs)
        assert _reserved(ray_head, jobs[0]) == {"CPU": 1}
    a, b = (rows[t] for t in at_kill)
    assert a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"], "the two jobs did not run side by side"
    assert {a["slot"], b["slot"]} == {0, 1}
    third = next(r for t, r in rows.items() if t not in at_kill)
    assert third["started_at"] >= min(a["ended_at"], b["ended_at"]) - 1  # it waited for a free slot


def test_more_trials_than_the_cluster_holds_now_are_queued_not_failed(ray_head, tmp_path):  # noqa: F811
    first_step_s = 20.0  # the first-step watchdog; both trials wait longer than that in Ray's queue
    runs = tmp_path / "runs"
    blocker = Blocker(ray_head, HEAD_CPUS)  # the cluster holds two trials, but another job has its CPUs now
    # --parallel 3 asks for more than the head ever holds: two slots, and the session says why
    cmd = [sys.executable, "-m", "mart.graph.cli", "tune", "--backend", "local", "--ray-address", ray_head,
           "--approve", "auto", "--parallel", "3", "--stages", "learning", "--learning-trials", "3",
           "--learning-horizon", "6", "--learning-confirm-trials", "0", "--first-step-timeout-s", str(first_step_s),
           *SETS, "--runs-dir", str(runs), "--json"]
    err = open(tmp_path / "progress.txt", "w+")
    tuner = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                             stderr=err, text=True)
    try:
        where = wait_for(lambda: run_folder(runs), 60, "the run directory")
        db = where / "mart.sqlite"
        queued = wait_for(lambda: (lambda rows: rows if len(rows) == 2 else None)(query(
            db, "select trial_id, waiting_since from trials where status='running' and waiting is not null")), 120,
            "two trials queued")
        status = _mart("status", where.name, "--runs-dir", str(runs))
        assert status.returncode == 0, status.stderr
        lines = [ln for ln in status.stdout.splitlines() if ln.startswith("running trial")]
        assert len(lines) == 2 and all(ln.endswith(f": {QUEUED}") for ln in lines), status.stdout
        since = min(r["waiting_since"] for r in queued)
        time.sleep(max(0.0, since + first_step_s + 5 - time.time()))  # past the first-step timeout, still queued
        assert len(query(db, "select trial_id from trials where waiting is not null and status='running'")) == 2
    finally:
        blocker.stop()
    try:
        out, _ = tuner.communicate(timeout=400)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    err.seek(0)
    progress = err.read()
    assert tuner.returncode == 0, progress[-3000:]
    summary = json.loads(out)
    assert summary["status"] == "completed" and summary["trials"]["failed"] == 0
    capped = (f"--parallel 3: the local backend runs {HEAD_CPUS} trial(s) at once ({HEAD_CPUS} CPUs on 1 node(s), 1 per "
              "trial); the other trials wait for a free slot")
    assert capped in summary["notes"] and capped in progress
    trials = {r["trial_id"]: r for r in query(db, "select * from trials")}
    assert len(trials) == 3 and {t["status"] for t in trials.values()} == {"completed"}
    assert {t["slot"] for t in trials.values()} == {0, 1}
    for r in queued:
        t = trials[r["trial_id"]]
        assert t["running_at"] - t["waiting_since"] > first_step_s  # waited past the watchdog's limit, not stopped
        assert f"⏸ {t['trial_id']}: {QUEUED}" in progress and f"▶ {t['trial_id']}: started after" in progress
