"""The verl backend: Hydra overrides from typed configs, launching and following verl runs.

Modules: ``backend`` (VerlBackend), ``runner`` (VerlRunner, WatchdogConfig), ``overrides`` (config ->
Hydra argv, base-config files), ``logs`` (console metrics, failure causes), ``prevalidate`` (verl's own
compose + validate_config, in a child process), ``supervise`` (exit-code recorder of a trial process).
"""

from mart.trial_runner.verl.backend import GRPO_BASE, VerlBackend
from mart.trial_runner.verl.runner import VerlRunner, WatchdogConfig

__all__ = ["GRPO_BASE", "VerlBackend", "VerlRunner", "WatchdogConfig"]
