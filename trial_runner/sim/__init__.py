"""A seeded simulator of verl GRPO jobs on named GPU-cluster scenarios (``--backend sim``).

``model`` is the pure core's facade (config + scenario + seed -> a timed verl metric stream; ground truths by
exhaustive search; below it: ``job`` types, ``catalogue``, ``scenarios``, ``system``, ``learning``, ``trial``,
``grid``, ``multi_agent``), ``runner`` plays a trial into its directory as simulated time passes, ``backend``
wraps both as a mart ``Backend``. Assumptions and sources: ``docs/sim.md``.
"""

from mart.trial_runner.sim.backend import SimBackend, nominal_step_seconds
from mart.trial_runner.sim.model import (
    base_config,
    expected_throughput,
    ground_truth,
    ground_truth_learning,
    simulate,
)
from mart.trial_runner.sim.runner import SimRunner, sim_usage
from mart.trial_runner.sim.scenarios import (
    GPUS,
    SCENARIOS,
    Scenario,
    ScenarioError,
    get_scenario,
    load_scenario,
)

__all__ = [
    "GPUS",
    "SCENARIOS",
    "Scenario",
    "ScenarioError",
    "SimBackend",
    "SimRunner",
    "base_config",
    "expected_throughput",
    "get_scenario",
    "ground_truth",
    "ground_truth_learning",
    "load_scenario",
    "nominal_step_seconds",
    "sim_usage",
    "simulate",
]
