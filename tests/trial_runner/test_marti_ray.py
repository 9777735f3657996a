"""MARTI trials as Ray jobs on a real local Ray head (the head fixture of test_ray_jobs.py): metrics parsed from
the job's log, the run ended at the horizon through ``stop_job`` (MARTI has no step limit), OOM classified."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("ray.job_submission", reason="ray[default] not installed: pip install 'mart[ray]'")

from mart.state.models import TrialStatus
from mart.state.trials import TrialSpec
from mart.trial_runner.base import read_status
from mart.trial_runner.marti.runner import MartiRayJobRunner
from mart.trial_runner.registry import load_backend
from tests.support.paths import REPO
from tests.support.trials import wait_finished
from tests.trial_runner.test_ray_jobs import ray_head  # noqa: F401 - the module-scoped head fixture

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]

FAKE_CMD = f"{sys.executable} {REPO / 'tests' / 'support' / 'fake_marti.py'}"


def test_marti_stand_in_as_ray_job(ray_head, tmp_path):  # noqa: F811
    env = {"FAKE_MARTI_STEP_S": "0.1"}
    backend = load_backend("marti", entrypoint=FAKE_CMD, ray_address=ray_head, memory_capacity_gb=80.0,
                           base_config={"eval_dataset": "data/MATH"}, runner_options={"env": env})
    runner = backend.make_runner()
    assert isinstance(runner, MartiRayJobRunner)
    spec = TrialSpec(trial_id="ray-marti", config=backend.base_config(), steps=3, trial_dir=str(tmp_path / "m"),
                     stage="learning")
    handle = runner.launch(spec)
    final = wait_finished(runner, handle, 120, every_s=0.5)
    assert final.status is TrialStatus.COMPLETED and "horizon" in final.reason, final
    recs = runner.read_all_metrics(handle)
    assert [r.step for r in recs] == [1, 2, 3]
    assert recs[-1].get("val-core/MATH/pass1") > 0 and recs[1].get("perf/throughput") > 0
    assert read_status(spec.trial_dir).status is TrialStatus.COMPLETED

    oom = {**env, "FAKE_MARTI_MODE": "oom_at_3"}
    backend2 = load_backend("marti", entrypoint=FAKE_CMD, ray_address=ray_head, memory_capacity_gb=80.0,
                            runner_options={"env": oom})
    r2 = backend2.make_runner()
    h2 = r2.launch(TrialSpec(trial_id="ray-marti-oom", config=backend2.base_config(), steps=5,
                             trial_dir=str(tmp_path / "o")))
    failed = wait_finished(r2, h2, 120, every_s=0.5)
    assert failed.status is TrialStatus.OOM and "CUDA out of memory" in failed.reason, failed
