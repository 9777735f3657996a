"""Trial runners: launch, watch and stop training jobs (local CPU GRPO, verl, Ray jobs, simulator).

The public face for backend plugins (``--backend package.module:factory`` loads one, see docs/backends.md):

* ``Backend``: search space, base config, config rules and a runner for one kind of training job;
* ``SearchSpace``, ``ParamSpec``, ``Constraint``: the knobs agents may propose, and their rules;
* ``TrialRunner``: ``launch(TrialSpec) -> TrialHandle``, ``poll(handle) -> TrialPoll``, ``stop(handle)``; a trial
  that waits for its resources (a scheduler's queue) polls ``RUNNING`` with ``TrialPoll.queued`` set (what it waits
  for): mart shows it queued, not failed, and its first-step watchdog starts once ``queued`` is unset;
* how many trials a backend holds at once: ``Backend.max_parallel_trials()`` (None, the default: no known limit;
  ``mart tune --parallel N`` uses at most that many slots) and ``Backend.parallel_limit_reason()`` (why, for the
  user: "16 GPUs on 2 node(s), 8 per trial"); the conformance suite runs two trials side by side unless it is 1;
* the trial-directory contract's writers and readers: ``write_record`` (one metric line),
  ``write_status``/``read_status`` (``status.json``), ``MetricsTail`` (incremental reader);
* ``ProcessGroup``: run a job as a detached process group and stop it (SIGTERM -> grace -> SIGKILL);
* ``load_backend``: a builtin name or ``package.module:factory`` -> ``Backend``.

``mart.trial_runner.testing`` holds the conformance suite a plugin runs on itself. Anything not listed
in ``__all__`` is internal and may change.
"""

from mart.state.metrics import StepRecord
from mart.state.models import TrialStatus
from mart.state.search_space import ConfigError, Constraint, ParamSpec, SearchSpace
from mart.state.trials import LOG_FILE, METRICS_FILE, STATUS_FILE, TrialHandle, TrialPoll, TrialSpec
from mart.trial_runner.base import Backend, TrialRunner, read_status, write_status
from mart.trial_runner.metrics import MetricsTail, write_record
from mart.trial_runner.process import LAUNCH_TOKEN_ENV, ProcessGroup
from mart.trial_runner.registry import load_backend

__all__ = [
    "Backend",
    "ConfigError",
    "Constraint",
    "LAUNCH_TOKEN_ENV",
    "LOG_FILE",
    "METRICS_FILE",
    "MetricsTail",
    "ParamSpec",
    "ProcessGroup",
    "STATUS_FILE",
    "SearchSpace",
    "StepRecord",
    "TrialHandle",
    "TrialPoll",
    "TrialRunner",
    "TrialSpec",
    "TrialStatus",
    "load_backend",
    "read_status",
    "write_record",
    "write_status",
]
