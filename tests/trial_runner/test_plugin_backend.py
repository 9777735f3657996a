"""Plugin backends: ``package.module:factory`` loads a user's backend without changing mart."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from mart.state.models import TrialStatus
from mart.state.trials import TrialSpec
from mart.trial_runner.base import Backend
from mart.trial_runner.registry import load_backend
from tests.support.paths import REPO as REPO_ROOT

ROOT = REPO_ROOT


@pytest.fixture
def repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def test_example_plugin_runs_a_trial_and_stops_one(repo_on_path, tmp_path: Path) -> None:
    backend = load_backend("examples.plugin_backend.backend:make_backend", step_s=0.01)
    with pytest.raises(ValueError, match="takes no option 'scenario'; valid options: capacity_gb, step_s"):
        load_backend("examples.plugin_backend.backend:make_backend", scenario="x")
    assert isinstance(backend, Backend) and backend.name == "toy-job"
    space = backend.search_space()
    assert [p.key for p in space.stage_params("learning")] == ["job.lr"]
    assert backend.validate_config({**backend.base_config(), "job.batch_size": 7, "job.workers": 2})  # constraint
    runner = backend.make_runner()
    handle = runner.launch(TrialSpec(trial_id="a", config=backend.base_config(), steps=5, trial_dir=str(tmp_path / "a"),
                                     memory_capacity_gb=backend.memory_capacity_gb()))
    deadline = time.monotonic() + 20
    while not (p := runner.poll(handle)).status.is_finished():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert p.status is TrialStatus.COMPLETED
    assert [r.step for r in runner.read_all_metrics(handle)] == list(range(6))
    long = runner.launch(TrialSpec(trial_id="b", config=backend.base_config(), steps=10_000, trial_dir=str(tmp_path / "b")))
    time.sleep(0.3)
    assert runner.stop(long, grace_s=5).status is TrialStatus.STOPPED
    oom = runner.launch(TrialSpec(trial_id="c", config={**backend.base_config(), "job.batch_size": 256, "job.workers": 8},
                                  steps=3, trial_dir=str(tmp_path / "c"), memory_capacity_gb=4.0))
    while not (p := runner.poll(oom)).status.is_finished():
        time.sleep(0.02)
    assert p.status is TrialStatus.OOM


def test_example_plugin_passes_the_shipped_conformance_suite(repo_on_path, tmp_path: Path) -> None:
    from examples.plugin_backend.test_conformance import test_toy_job_backend_conforms

    test_toy_job_backend_conforms(tmp_path)


def test_conformance_cli_runs_on_a_plugin(tmp_path: Path) -> None:
    """``python -m mart.trial_runner.testing SPEC``: what a plugin author runs without writing a test."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "mart.trial_runner.testing", "examples.plugin_backend.backend:make_backend",
                          "--short-steps", "3", "--long-steps", "100000", "--workdir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok", "backend", "ok", "completes", "ok", "stop", "ok", "two", "at", "once"]
    bad = subprocess.run([sys.executable, "-m", "mart.trial_runner.testing", "no_such_pkg.mod:make"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "FAIL backend" in bad.stderr and "cannot import" in bad.stderr


def test_plugin_from_a_package_of_ones_own(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "acme_backends"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sim_wrap.py").write_text(textwrap.dedent('''
        from mart.trial_runner.sim import SimBackend

        class AcmeBackend(SimBackend):
            name = "acme"

        def make(**options):
            return AcmeBackend(scenario=options.pop("scenario", "qwen3-0.6b-1x8"), **options)

        def not_a_backend(**options):
            return {"oops": True}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    backend = load_backend("acme_backends.sim_wrap:make", scenario="qwen3-8b-2x8", seed=3)
    assert backend.name == "acme" and backend.base_config()["trainer.nnodes"] == 2 and backend.seed == 3
    with pytest.raises(ValueError, match="not a trial_runner.base.Backend"):
        load_backend("acme_backends.sim_wrap:not_a_backend")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        load_backend("acme_backends.sim_wrap:missing")


@pytest.mark.parametrize("spec, message", [
    ("nosuch", "package.module:factory"),
    ("no_such_package_xyz.mod:make", "cannot import"),
    ("mart.trial_runner.sim.backend:NoSuchFactory", "has no attribute"),
])
def test_bad_plugin_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_backend(spec)


def test_builtin_sim_name_and_plugin_path_are_the_same_backend() -> None:
    a = load_backend("sim", scenario="qwen3-0.6b-2x8")
    b = load_backend("mart.trial_runner.sim.backend:SimBackend", scenario="qwen3-0.6b-2x8")
    assert type(a) is type(b) and a.base_config() == b.base_config()
