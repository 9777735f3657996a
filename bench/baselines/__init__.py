"""Baseline tuners for ``bench/compare.py``: verl defaults, random, grid, TPE and CMA-ES (full and focused space).

Every baseline runs trials through mart's own ``Backend``/``TrialRunner`` interfaces, pays for its OOM and
failed trials, and follows the same two-stage protocol as mart: stage 1 picks a system config by
throughput under the memory margin, stage 2 tunes the learning knobs with that system config fixed.
The default config is each method's first trial of each stage (mart's baseline counts in its budget too).
"""

from bench.baselines.common import Budget, MethodResult, TrialOutcome, run_trial
from bench.baselines.methods import METHODS, run_method

__all__ = ["METHODS", "Budget", "MethodResult", "TrialOutcome", "run_method", "run_trial"]
