"""The ``marti`` backend: MARTI's multi-agent trainer (github.com/TsinghuaC3I/MARTI) as mart trials.

    mart trial --backend marti --base-config my_marti.yaml --steps 5 --out runs/t1
    mart tune  --backend marti --base-config my_marti.yaml [--verl-entrypoint "python -m marti.cli.multi_agent_train_ppo_ray"]
               [--ray-address http://HEAD:8265]

The base config is a YAML/JSON mapping of the flat keys ``space`` describes (MARTI's flag names,
``agents.<i>.<key>``, ``workflow_args.<key>``, ``reward_alloc.<key>``, ``async_num_tasks``, ...); the user's data,
models and cluster layout go there, the candidate's knobs are applied over it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from mart.state.search_space import ConfigError, SearchSpace
from mart.trial_runner.base import Backend, TrialRunner
from mart.trial_runner.gpu import GpuBackendCapacity
from mart.trial_runner.marti.argv import split_config
from mart.trial_runner.marti.prevalidate import check_argv
from mart.trial_runner.marti.runner import RUN_FLAGS, MartiRayJobRunner, MartiRunner
from mart.trial_runner.marti.space import MARTI_BASE, agent_ids, build_space
from mart.trial_runner.verl.overrides import load_base_config
from mart.trial_runner.verl.runner import WatchdogConfig


class MartiBackend(GpuBackendCapacity, Backend):
    """MARTI on this machine (one node, MARTI starts its own Ray) or, with ``ray_address``, as Ray jobs.

    Args:
        entrypoint: launch command (``--verl-entrypoint``), default ``python -m marti.cli.multi_agent_train_ppo_ray``.
        base_config: the user's base config: a YAML/JSON file of flat (or nested) keys, or the mapping itself.
        ray_address: the cluster's dashboard address (``http://HEAD:8265``): trials become Ray jobs.
        memory_capacity_gb: memory per GPU for the margin rule when NVML finds no GPU here.
        verl_python: the interpreter that runs MARTI (``--verl-python``; it replaces ``python`` in the entrypoint).
        stall_timeout_s, first_step_timeout_s: progress watchdog limits (``--backend-option``).
        runner_options: further keyword arguments of ``MartiRunner`` (kill_grace_s, oom_exit_grace_s, env, ...).
        entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources: with ``ray_address``, what each trial's
            driver reserves (default: nothing; MARTI's own placement groups ask Ray for the job's GPUs).
    """

    name = "marti"
    score_metric_prefix = "val-core/"

    def __init__(
        self,
        entrypoint: str | None = None,
        base_config: str | dict[str, Any] | None = None,
        ray_address: str | None = None,
        memory_capacity_gb: float | None = None,
        *,
        verl_python: str | None = None,
        stall_timeout_s: float | None = None,
        first_step_timeout_s: float | None = None,
        runner_options: dict[str, Any] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_resources: dict[str, float] | None = None,
    ) -> None:
        self.entrypoint = entrypoint
        self.user_base = load_base_config(base_config)
        for key, value in self.user_base.items():
            # trials run in their own directory: a workflow file named relative to here must stay found
            if key.endswith("func_path") and isinstance(value, str) and not os.path.isabs(value) and \
                    os.path.isfile(value):
                self.user_base[key] = os.path.abspath(value)
        bad = sorted(k for k in self.user_base if k in RUN_FLAGS)
        if bad:
            warnings.warn(f"marti backend: the base config's {bad} are set by mart on every trial (paths in the trial "
                          "directory, evaluation at the horizon, no silent resume); its values are ignored", stacklevel=2)
        split_config(self.user_base)  # fail early on a key or value MARTI cannot take (or a secret)
        self.ray_address = ray_address
        self._init_ray_sizing(ray_address, entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources)
        self._memory_capacity_gb = memory_capacity_gb
        self.python = verl_python or ("python" if ray_address else None)
        self.watchdog = None
        if stall_timeout_s is not None or first_step_timeout_s is not None:
            self.watchdog = WatchdogConfig(
                stall_timeout_s=None if stall_timeout_s is None else float(stall_timeout_s),
                first_step_timeout_s=None if first_step_timeout_s is None else float(first_step_timeout_s))
        self.runner_options = dict(runner_options or {})
        self._gpus: list | None = None
        self._runner()  # fail early on a bad entrypoint string

    # ------------------------------------------------------------------------------ catalogue & config

    def _n_agents(self) -> int:
        return len(agent_ids({**MARTI_BASE, **self.user_base}))

    def search_space(self) -> SearchSpace:
        return build_space(self._n_agents())

    def allowed_keys(self) -> frozenset[str]:
        """Keys that may reach MARTI's command line: catalogue knobs, the base config's keys, mart's baseline."""
        return frozenset(p.key for p in self.search_space().params) | frozenset(self.user_base) | frozenset(MARTI_BASE)

    def extend_base(self, values: dict[str, Any]) -> None:
        """Add MARTI keys outside the catalogue to the base config (``mart trial --set eval_dataset=...``)."""
        split_config(values)
        self.user_base.update(values)

    def base_config(self) -> dict[str, Any]:
        """Catalogue defaults, mart's baseline (MARTI's debate example), then the user's base."""
        cfg: dict[str, Any] = self.search_space().defaults()
        cfg.update(MARTI_BASE)
        cfg.update(self.user_base)
        return cfg

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        """MARTI's rules (the catalogue's constraints), the key whitelist, then the argv through a parser built
        from MARTI's flag table (``prevalidate``)."""
        errors = list(self.search_space().check_constraints(config))
        try:
            argv = self._runner().config_overrides(config)
        except ConfigError as e:
            return errors + [str(e)]
        if not errors:
            errors += [f"MARTI argv: {m}" for m in check_argv(argv)]
        return errors

    # ------------------------------------------------------------------------------ runners

    def _runner(self) -> MartiRunner:
        options: dict[str, Any] = {
            "gpu_free_threshold_gb": None if self.ray_address else 2.0,
            "sample_gpu": self.ray_address is None,
            "python": self.python,
            **self.runner_options,
        }
        return MartiRunner(self.entrypoint, allowed_keys=self.allowed_keys(), watchdog=self.watchdog, **options)

    def make_runner(self) -> TrialRunner:
        runner = self._runner()
        if self.ray_address:
            return MartiRayJobRunner(self.ray_address, runner, **self.ray_runner_options())
        return runner

    def _ray_gpu_groups(self) -> tuple[int, int, bool]:
        """The job's GPUs (every tuned agent's actor, reference and vLLM engines), not bound to one node: MARTI's
        placement groups spread its models over the cluster."""
        from mart.trial_runner.marti.space import job_gpus

        return 1, job_gpus(self.base_config()), False

__all__ = ["MartiBackend"]
