"""The plugin's own test: mart's trial-runner conformance suite on the toy-job backend.

Run it with ``pytest examples/plugin_backend/test_conformance.py`` (from the repository root), or without
pytest: ``python -m mart.trial_runner.testing examples.plugin_backend.backend:make_backend``.
A plugin of your own copies this file and swaps in its factory.
"""

from __future__ import annotations

from examples.plugin_backend.backend import make_backend
from mart.trial_runner.testing import RunnerConformance


def test_toy_job_backend_conforms(tmp_path) -> None:
    # a fast job (10 ms per step); the stop check needs a horizon that is still running after a step
    suite = RunnerConformance(lambda: make_backend(step_s=0.01), short_steps=5, long_steps=10_000)
    assert suite.run_all(tmp_path) == ["backend", "completes", "stop", "two at once"]
