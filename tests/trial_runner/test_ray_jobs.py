"""Trials as Ray jobs on a real Ray head started by this module (127.0.0.1, own temp dir, own token).

The head is started with ``ray start --head`` in a new session, in a temp dir of its own (so nothing is
written to /tmp/ray and no other test's ``ray.init()`` can find it), with a fresh auth token passed in the
environment (so ~/.ray/auth_token is neither read nor written). Teardown stops exactly the processes it
started: the ``ray start`` process group and their descendants, by PID. ``ray stop`` is never used (it
would stop other people's clusters on this machine).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray.job_submission", reason="ray[default] not installed: pip install 'mart[ray]'")

from mart.state.models import TrialStatus
from mart.state.trials import TrialSpec
from mart.trial_runner.base import read_status
from mart.trial_runner.ray.runner import RayJobRunner
from mart.trial_runner.registry import load_backend
from tests.support.paths import FAKE_VERL
from tests.support.trials import wait_finished

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

FAKE = FAKE_VERL
#: a local-workload config that runs a step in well under a second on one CPU thread
TINY_LOCAL = {
    "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2, "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
    "data.max_response_length": 12, "local.task.val_size": 8, "trainer.val_before_train": False,
    "trainer.test_freq": -1, "local.num_threads": 1, "actor_rollout_ref.rollout.max_num_seqs": 4,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_and_descendants(pgid: int) -> list[psutil.Process]:
    procs: dict[int, psutil.Process] = {}
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                procs[p.pid] = p
                for c in p.children(recursive=True):
                    procs[c.pid] = c
        except (ProcessLookupError, psutil.Error):
            continue
    return list(procs.values())


@pytest.fixture(scope="module")
def ray_head():
    ray_bin = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    temp_dir = tempfile.mkdtemp(prefix="mr", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    port = _free_port()
    token = secrets.token_hex(16)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    env.pop("RAY_ADDRESS", None)
    starter = subprocess.Popen(
        [ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", "--port=0", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={port}", "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={temp_dir}",
         # Ray's fixed defaults (the job agent's 52365, the client server's 10001) would clash with another head on
         # this machine: its job agent would never come up ("No available agent to submit job")
         f"--dashboard-agent-listen-port={_free_port()}", f"--ray-client-server-port={_free_port()}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    pgid = starter.pid
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_TOKEN",)}
    try:
        out, _ = starter.communicate(timeout=120)
        if starter.returncode != 0:
            pytest.fail(f"ray start failed ({starter.returncode}):\n{out[-3000:]}")
        os.environ["RAY_AUTH_TOKEN"] = token  # read by RayJobRunner (find_token); restored below
        address = f"http://127.0.0.1:{port}"
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + 60
        while True:
            try:
                JobSubmissionClient(address, headers={"Authorization": f"Bearer {token}"}).list_jobs()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield address
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        # a throwaway head: killed at once (SIGTERM made Ray's processes take ~6 s to exit per test module)
        procs = _group_and_descendants(pgid)
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
        shutil.rmtree(temp_dir, ignore_errors=True)



def _wait(runner, handle, timeout_s: float):
    return wait_finished(runner, handle, timeout_s, every_s=0.5)


def test_two_local_trials_as_ray_jobs_stop_one_read_the_other(ray_head, tmp_path):
    pytest.importorskip("mart.trial_runner.local.runner", reason="the local workload runner is not in this checkout")
    backend = load_backend("local", ray_address=ray_head)
    runner = backend.make_runner()
    assert isinstance(runner, RayJobRunner)
    cfg = backend.base_config() | TINY_LOCAL
    short = TrialSpec(trial_id="ray-short", config=cfg, steps=3, trial_dir=str(tmp_path / "short"))
    long = TrialSpec(trial_id="ray-long", config=cfg, steps=5000, trial_dir=str(tmp_path / "long"))
    h_short = runner.launch(short)
    h_long = runner.launch(long)
    assert h_short.job_id != h_long.job_id

    # re-launching a live trial re-attaches to its job instead of submitting a second one
    again = runner.launch(long)
    assert again.job_id == h_long.job_id and again.extra.get("reattached")

    # stop the long one once it has made progress
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        p = runner.poll(h_long)
        assert p.status is TrialStatus.RUNNING, p
        if p.last_step is not None and p.last_step >= 1:
            break
        time.sleep(0.5)
    stopped = runner.stop(h_long, reason="stopped early by the test", grace_s=2.0)
    assert stopped.status is TrialStatus.STOPPED and stopped.reason == "stopped early by the test"
    assert runner.client.get_job_status(h_long.job_id).value == "STOPPED"
    assert stopped.last_step < 5000

    final = _wait(runner, h_short, 120)
    assert final.status is TrialStatus.COMPLETED, final
    recs = runner.read_all_metrics(h_short)
    assert [r.step for r in recs if r.step >= 1] == [1, 2, 3]
    assert read_status(short.trial_dir).status is TrialStatus.COMPLETED
    # the job's output was mirrored into the trial directory
    assert (Path(short.trial_dir) / "trial.log").stat().st_size > 0


def test_verl_stand_in_as_ray_job_with_metrics_from_logs(ray_head, tmp_path):
    """A verl trial through ``--ray-address``: the shared metrics file, and the job-log fallback."""
    backend = load_backend("verl", entrypoint=f"{sys.executable} {FAKE}", ray_address=ray_head,
                           base_config={"fake.step_s": 0.05})
    runner = backend.make_runner()
    assert isinstance(runner, RayJobRunner)
    spec = TrialSpec(trial_id="ray-verl", config=backend.base_config(), steps=4, trial_dir=str(tmp_path / "v"))
    handle = runner.launch(spec)
    final = _wait(runner, handle, 90)
    assert final.status is TrialStatus.COMPLETED and final.last_step == 4, final
    from_file = [r.step for r in runner.read_all_metrics(handle)]
    assert from_file == [1, 2, 3, 4]  # mart owns val_before_train: no step-0 validation unless asked for
    logs_only = RayJobRunner(ray_head, backend.make_runner().inner, metrics_source="logs")
    from_logs = logs_only.read_all_metrics(handle)
    assert [r.step for r in from_logs] == from_file
    assert from_logs[2].get("perf/throughput") > 0

    # a crash in a job: FAILED with the driver's error line
    crash = backend.base_config() | {"fake.mode": "crash"}
    backend2 = load_backend("verl", entrypoint=f"{sys.executable} {FAKE}", ray_address=ray_head,
                            base_config={"fake.step_s": 0.05, "fake.mode": "crash"})
    h2 = backend2.make_runner().launch(TrialSpec(trial_id="ray-crash", config=crash, steps=4,
                                                 trial_dir=str(tmp_path / "c")))
    failed = _wait(backend2.make_runner(), h2, 90)
    assert failed.status is TrialStatus.FAILED and "RuntimeError: fake verl: worker died" in failed.reason

    # a hung job is stopped by the verl runner's watchdog, through stop_job
    from mart.trial_runner.verl import VerlBackend, WatchdogConfig

    backend3 = VerlBackend(entrypoint=f"{sys.executable} {FAKE}", ray_address=ray_head, prevalidate=False,
                           base_config={"fake.step_s": 0.05, "fake.mode": "hang"},
                           watchdog=WatchdogConfig(first_step_timeout_s=60, k=3, min_step_timeout_s=2, expected_step_s=0.1))
    r3 = backend3.make_runner()
    h3 = r3.launch(TrialSpec(trial_id="ray-hang", config=backend3.base_config(), steps=6, trial_dir=str(tmp_path / "h")))
    hung = _wait(r3, h3, 90)
    assert hung.status is TrialStatus.STOPPED and hung.reason.startswith("watchdog:") and hung.last_step == 2
    assert r3.client.get_job_status(h3.job_id).value == "STOPPED"

    # the user's longer schedule goes to verl; the job is ended once the horizon's step is logged
    backend4 = VerlBackend(entrypoint=f"{sys.executable} {FAKE}", ray_address=ray_head, prevalidate=False,
                           base_config={"fake.step_s": 0.2, "trainer.total_training_steps": 1000})
    r4 = backend4.make_runner()
    h4 = r4.launch(TrialSpec(trial_id="ray-sched", config=backend4.base_config(), steps=3, trial_dir=str(tmp_path / "s"),
                             stage="system"))
    ended = _wait(r4, h4, 90)
    assert ended.status is TrialStatus.COMPLETED and "horizon" in ended.reason and 3 <= ended.last_step < 1000
    assert r4.client.get_job_status(h4.job_id).value == "STOPPED"
