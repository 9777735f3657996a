"""The shipped conformance suite (``mart.trial_runner.testing``) over every builtin backend: local, sim and
the verl stand-in. The Ray runner has its own test (needs a head); the example plugin runs the same suite
in test_plugin_backend.py.
"""

from __future__ import annotations

import sys

import pytest

from mart.trial_runner.registry import load_backend
from mart.trial_runner.testing import ConformanceError, RunnerConformance
from tests.support.paths import FAKE_VERL

FAKE_VERL_CMD = f"{sys.executable} {FAKE_VERL}"
#: what verl logs every step and the builtin backends all mirror (plugins need only perf/throughput)
VERL_METRICS = ("perf/throughput", "timing_s/step", "timing_s/gen", "actor/entropy", "critic/score/mean")


@pytest.fixture(params=["local", "sim", "verl-standin"])
def suite(request, local_tiny_config, monkeypatch) -> RunnerConformance:
    name = request.param
    if name == "local":
        return RunnerConformance(lambda: load_backend("local"), overrides=local_tiny_config, long_steps=400,
                                 expected_metrics=VERL_METRICS)
    if name == "sim":
        return RunnerConformance(lambda: load_backend("sim", scenario="qwen3-0.6b-1x8", seed=1), long_steps=5000,
                                 expected_metrics=VERL_METRICS)
    monkeypatch.setenv("FAKE_VERL_MODE", "normal")
    return RunnerConformance(lambda: load_backend("verl", entrypoint=FAKE_VERL_CMD), long_steps=2000,
                             expected_metrics=VERL_METRICS)


def test_backend_members(suite) -> None:
    suite.check_backend()


def test_completes_with_verl_metrics_read_incrementally(suite, tmp_path) -> None:
    suite.check_completes(tmp_path)


def test_stop_is_prompt_and_final_and_works_from_a_fresh_runner(suite, tmp_path) -> None:
    suite.check_stop(tmp_path)


def test_two_trials_side_by_side_one_stopped_the_other_completes(suite, tmp_path) -> None:
    suite.check_two_at_once(tmp_path)


def test_the_two_at_once_check_catches_trials_that_share_a_directory(tmp_path) -> None:
    """A runner that writes every trial into one place fails the side-by-side check."""
    from mart.trial_runner.sim.backend import SimBackend
    from mart.trial_runner.sim.runner import SimRunner

    class OneDirRunner(SimRunner):
        def launch(self, spec):
            return super().launch(spec.model_copy(update={"trial_dir": str(tmp_path / "shared")}))

    class OneDirBackend(SimBackend):
        name = "sim-onedir"

        def make_runner(self):
            return OneDirRunner(*self._runner_args)

    (tmp_path / "shared").mkdir()
    suite = RunnerConformance(lambda: OneDirBackend(scenario="qwen3-0.6b-1x8"), long_steps=5000)
    with pytest.raises(ConformanceError, match="directories of their own"):
        suite.check_two_at_once(tmp_path / "w")


def test_the_suite_catches_a_broken_runner(tmp_path) -> None:
    """The suite can fail: a sim runner whose stop() leaves the trial running is caught."""
    from mart.trial_runner.sim.backend import SimBackend
    from mart.trial_runner.sim.runner import SimRunner

    class NoStopRunner(SimRunner):
        def stop(self, handle, reason="stopped by mart", grace_s=5.0):
            return self.poll(handle)

    class NoStopBackend(SimBackend):
        name = "sim-nostop"

        def make_runner(self):
            return NoStopRunner(*self._runner_args)

    suite = RunnerConformance(lambda: NoStopBackend(scenario="qwen3-0.6b-1x8"), long_steps=5000)
    suite.check_completes(tmp_path / "ok")  # the rest of it is fine
    with pytest.raises(ConformanceError, match="stop\\(\\) must return status stopped"):
        suite.check_stop(tmp_path / "broken")


def test_the_suite_needs_no_pytest_at_import() -> None:
    import subprocess

    code = "import sys, mart.trial_runner.testing; assert 'pytest' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
