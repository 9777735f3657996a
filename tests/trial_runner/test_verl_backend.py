"""VerlBackend: registry options, base config merge, validation, runners, and ``mart trial --backend verl``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mart.state.models import TrialStatus
from mart.state.search_space import ConfigError
from mart.trial_runner.base import read_status
from mart.trial_runner.metrics import MetricsTail
from mart.trial_runner.registry import load_backend
from mart.trial_runner.verl import GRPO_BASE, VerlBackend, VerlRunner
from tests.support.paths import FAKE_VERL
from tests.support.paths import REPO as REPO_ROOT

FAKE = FAKE_VERL
REPO = REPO_ROOT
A = "actor_rollout_ref"


def test_registry_builds_it_with_the_cli_options(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("data.train_files: /d/train.parquet\ntrainer.n_gpus_per_node: 2\n"
                    "actor_rollout_ref.rollout.tensor_model_parallel_size: 1\n")
    b = load_backend("verl", entrypoint="python -m verl.trainer.main_ppo", base_config=str(base),
                     memory_capacity_gb=80.0)
    assert isinstance(b, VerlBackend) and b.name == "verl"
    cfg = b.base_config()
    assert cfg["data.train_files"] == "/d/train.parquet" and cfg["trainer.n_gpus_per_node"] == 2
    assert cfg[f"{A}.rollout.tensor_model_parallel_size"] == 1  # the user's base wins over verl's default
    assert cfg[f"{A}.rollout.gpu_memory_utilization"] == 0.5  # catalogue default
    for k, v in GRPO_BASE.items():
        assert cfg[k] == v
    assert isinstance(b.make_runner(), VerlRunner)
    # no GPU here: the configured capacity is the margin's reference
    from mart.trial_runner.gpu import probe

    if not probe():
        assert b.memory_capacity_gb() == 80.0


def test_validate_config_uses_constraints_and_the_whitelist():
    b = VerlBackend(prevalidate=False)
    cfg = b.base_config()
    assert b.validate_config(cfg) == []
    bad = dict(cfg, **{"trainer.n_gpus_per_node": 3})
    assert any("batch_divisible_by_gpus" in e for e in b.validate_config(bad))
    sneaky = dict(cfg, **{"trainer.some_unknown_key": 1})
    assert any("refusing" in e for e in b.validate_config(sneaky))


def test_bad_base_config_fails_at_construction(tmp_path):
    with pytest.raises(ConfigError):
        VerlBackend(base_config=str(tmp_path / "nope.yaml"))


def test_verl_prevalidation_failure_never_raises(monkeypatch):
    b = VerlBackend(prevalidate=True)

    def boom(_):
        raise RuntimeError("verl is not installed")

    monkeypatch.setattr("mart.trial_runner.verl.backend.validate_many", boom)
    errs = b.validate_config(b.base_config())
    assert errs and "could not run verl's validation" in errs[0]


def test_ray_address_wraps_the_runner():
    from mart.trial_runner.ray.runner import RayJobRunner

    b = VerlBackend(entrypoint=f"{sys.executable} {FAKE}", ray_address="127.0.0.1:8265")
    r = b.make_runner()
    assert isinstance(r, RayJobRunner) and r.address == "http://127.0.0.1:8265"
    assert isinstance(r.inner, VerlRunner) and r.inner.gpu_free_threshold_gb is None


def test_mart_trial_backend_verl_with_the_stand_in(tmp_path):
    pytest.importorskip("mart.trial_runner.trial_command", reason="mart trial's command module is not in this checkout")
    out = tmp_path / "trial"
    base = tmp_path / "base.yaml"  # the stand-in's own knobs are the user's base config, so whitelisted
    base.write_text("fake.step_s: 0.02\ndata.train_batch_size: 512\n")
    env = dict(os.environ)

    def mart_trial(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mart.graph.cli", "trial", "--backend", "verl", "--verl-entrypoint",
             "python tests/support/fake_verl/main_ppo.py", "--base-config", str(base), "--steps", "5", *extra],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
        )

    # a catalogue knob outside its range is refused before anything starts, as in `mart tune`
    refused = mart_trial("--out", str(tmp_path / "refused"), "--set",
                         "actor_rollout_ref.rollout.gpu_memory_utilization=1.5")
    assert refused.returncode == 2 and "gpu_memory_utilization" in refused.stdout + refused.stderr
    assert not (tmp_path / "refused" / "trial.log").exists()

    # a verl key outside the catalogue is a base-config value: it reaches verl as the user's own
    # (test_freq 5 is kept: it hits the horizon)
    proc = mart_trial("--out", str(out), "--set", "actor_rollout_ref.rollout.gpu_memory_utilization=0.7",
                      "--set", "trainer.test_freq=5", "--set", "trainer.val_before_train=true")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert read_status(out).status is TrialStatus.COMPLETED
    recs = MetricsTail(out / "metrics.jsonl").read_new()
    assert [r.step for r in recs] == [0, 1, 2, 3, 4, 5]
    argv = json.loads((out / "attempt-1" / "launch.json").read_text())["argv"]
    assert "trainer.test_freq=5" in argv and "trainer.val_before_train=true" in argv
    argv = json.dumps(argv)
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.7" in argv
    assert "data.train_batch_size=512" in argv and "+fake.step_s=0.02" in argv
