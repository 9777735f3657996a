"""The ``verl`` backend: verl's search-space catalogue, the user's base config, pre-validation, runners.

    mart trial --backend verl --base-config my_verl.yaml --steps 5 --out runs/t1
    mart tune  --backend verl --base-config my_verl.yaml [--verl-entrypoint "bash my_wrapper.sh"]
               [--ray-address http://HEAD:8265]

The base config is the user's data, model and cluster shape (see ``mart.trial_runner.verl.overrides`` for the
accepted file forms); the candidate's knobs are applied over it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from mart.state.job import JobDescription
from mart.state.models import config_hash
from mart.state.search_space import ConfigError, SearchSpace
from mart.trial_runner.base import Backend, TrialRunner
from mart.trial_runner.gpu import GpuBackendCapacity
from mart.trial_runner.verl.overrides import check_key, load_base_config
from mart.trial_runner.verl.prevalidate import validate_many, verl_available
from mart.trial_runner.verl.runner import FIXED_KEYS, VerlRunner, WatchdogConfig
from mart.trial_runner.verl.space import SEARCH_SPACE, VERL_DEFAULTS

#: mart tunes GRPO: these hold unless the user's base config says otherwise (rollout.n = verl's GRPO example).
GRPO_BASE: dict[str, Any] = {
    "algorithm.adv_estimator": "grpo",
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.n": 5,
}


class VerlBackend(GpuBackendCapacity, Backend):
    """verl on this machine (one node) or, with ``ray_address``, as Ray jobs on an existing cluster.

    Args:
        entrypoint: launch command, default ``python -m verl.trainer.main_ppo`` (``--verl-entrypoint``).
        base_config: path of the user's base config (YAML/JSON mapping or list of overrides), or the
            mapping / list itself.
        ray_address: the cluster's dashboard address (``http://HEAD:8265``): trials become Ray jobs.
        memory_capacity_gb: memory per GPU for the margin rule when NVML finds no GPU here (e.g. the
            trials run on a remote cluster); NVML's per-GPU total wins when GPUs are present.
        prevalidate: compose and validate candidates with verl (None = when verl is importable).
        watchdog: progress watchdog of the runner.
        runner_options: further keyword arguments of ``VerlRunner`` (kill_grace_s, oom_exit_grace_s, env, ...).
        verl_python: the interpreter that runs verl (``--verl-python``; default: the tuner's own for local
            trials, ``python`` on the job's node for Ray jobs). Replaces ``python``/``python3`` at the head of
            the entrypoint.
        stall_timeout_s, first_step_timeout_s: watchdog limits (``--backend-option``); default: derived from
            the measured step and start-up times (``WatchdogConfig``).
        verl_version: the verl release on the cluster (``--backend-option verl_version=0.9.1``): without verl
            importable here, the bundled key list (which decides Hydra's ``+``) must be that release's; a
            mismatch is refused with the way out.
        entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources: with ``ray_address``, what each trial's
            driver reserves (default: nothing; verl's resource pools ask Ray for ``trainer.nnodes`` x
            ``trainer.n_gpus_per_node`` GPUs themselves). See docs/backends.md, "Sizing a trial on a cluster".
    """

    name = "verl"
    score_metric_prefix = "val-core/"

    def __init__(
        self,
        entrypoint: str | None = None,
        base_config: str | dict[str, Any] | list[str] | None = None,
        ray_address: str | None = None,
        memory_capacity_gb: float | None = None,
        *,
        prevalidate: bool | None = None,
        watchdog: WatchdogConfig | None = None,
        runner_options: dict[str, Any] | None = None,
        verl_python: str | None = None,
        stall_timeout_s: float | None = None,
        first_step_timeout_s: float | None = None,
        verl_version: str | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_resources: dict[str, float] | None = None,
    ) -> None:
        _check_key_list(verl_version)
        self.entrypoint = entrypoint
        self.base_config_source = base_config
        self.user_base = load_base_config(base_config)
        self.script = self._import_script(entrypoint)
        if self.script is not None:  # the script's settings are the user's; an explicit base config wins
            self.user_base = {**self.script.overrides, **self.user_base}
        self.ray_address = ray_address
        self._init_ray_sizing(ray_address, entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources)
        self._memory_capacity_gb = memory_capacity_gb
        self.prevalidate = verl_available() if prevalidate is None else prevalidate
        if watchdog is None and (stall_timeout_s is not None or first_step_timeout_s is not None):
            watchdog = WatchdogConfig(
                stall_timeout_s=None if stall_timeout_s is None else float(stall_timeout_s),
                first_step_timeout_s=None if first_step_timeout_s is None else float(first_step_timeout_s))
        self.watchdog = watchdog
        self.runner_options = dict(runner_options or {})
        # Ray jobs run on the cluster's nodes: the tuner's interpreter path means nothing there
        self.verl_python = verl_python or ("python" if ray_address else None)
        self._gpus: list | None = None
        self._verl_cache: dict[str, list[str]] = {}
        # fail early on a bad entrypoint string
        VerlRunner(entrypoint, sample_gpu=False, python=self.verl_python)

    def missing_requirement(self) -> str | None:
        """verl itself, when trials run ``python -m verl.trainer.main_ppo`` in this interpreter (the default launch);
        another entrypoint, interpreter or a Ray cluster brings its own."""
        if self.entrypoint is None and self.verl_python is None and not self.ray_address and not verl_available():
            return "verl is not installed: pip install -e '.[verl]' (or give --verl-entrypoint / --verl-python)"
        return None

    @staticmethod
    def _import_script(entrypoint: str | None):
        """The run script an entrypoint runs, imported (see ``script.py``), or None for other launchers."""
        if not isinstance(entrypoint, str):
            return None
        import shlex

        from mart.trial_runner.verl.script import import_run_script_file, script_in_entrypoint

        path = script_in_entrypoint(shlex.split(entrypoint))
        if path is None:
            return None
        try:
            imported = import_run_script_file(path)
        except ConfigError:
            return None  # a wrapper without verl's command line in it (docker run ..., srun ...)
        if not imported.passes_args:
            raise ConfigError(f"run script {path!r} does not pass its arguments to verl (no \"$@\" after the "
                              "overrides): mart's candidate overrides would never reach verl. Add \"$@\" at the end "
                              f"of the verl command, or turn the script into a base config: mart import-verl {path}")
        for note in imported.unresolved:
            warnings.warn(f"run script {path}: could not resolve {note}; the script's own value holds, and mart "
                          "records its catalogue default for it", stacklevel=3)
        return imported

    def extend_base(self, values: dict[str, Any]) -> None:
        """Add verl keys outside the catalogue to the base config (``mart trial --set trainer.test_freq=5``).

        They reach the command line as the user's values; verl's own schema judges them when verl is
        installed (pre-validation), the key grammar always.
        """
        from mart.trial_runner.verl.overrides import needs_plus, yaml_keys

        _, open_maps = yaml_keys()
        for key in values:
            check_key(key)
            if needs_plus(key) and not any(key.startswith(m + ".") for m in open_maps):
                warnings.warn(f"`{key}` is not a key of verl's config; it reaches verl as +{key} (a new key). "
                              "Check the spelling if you meant an existing one.", stacklevel=2)
        self.user_base.update(values)

    # ------------------------------------------------------------------------------ catalogue & config

    def search_space(self) -> SearchSpace:
        return SEARCH_SPACE

    def allowed_keys(self) -> frozenset[str]:
        """Keys that may reach verl's command line: catalogue knobs, the base config's keys, mart's own."""
        return frozenset(p.key for p in SEARCH_SPACE.params) | frozenset(self.user_base) | frozenset(GRPO_BASE) | \
            FIXED_KEYS | {"trainer.n_gpus_per_node"}

    def base_config(self) -> dict[str, Any]:
        """verl's defaults of the catalogue knobs, mart's GRPO settings, the GPUs of a node (found here, or the
        cluster's smallest GPU node: one whole node per trial), then the user's base."""
        cfg: dict[str, Any] = SEARCH_SPACE.defaults()
        cfg.update(GRPO_BASE)
        if "trainer.n_gpus_per_node" not in self.user_base:
            node_gpus = len(self._probe()) if self.ray_address is None else self.ray_cluster().gpus_per_node()
            if node_gpus:
                cfg["trainer.n_gpus_per_node"] = node_gpus
        cfg.update(self.user_base)
        return cfg

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        """Catalogue constraints, the key whitelist, then (when enabled) verl's own compose + validate."""
        errors = list(SEARCH_SPACE.check_constraints(config))
        runner = self._runner()
        try:
            overrides = runner.config_overrides(config)
        except ConfigError as e:
            return errors + [str(e)]
        if self.prevalidate and not errors:
            errors += [f"verl validate_config: {m}" for m in self.verl_validate([overrides])[0]]
        return errors

    def verl_validate(self, override_lists: list[list[str]]) -> list[list[str]]:
        """verl's verdict on each override list (cached by content); [] entries are valid."""
        keys = [config_hash({"o": ovs}) for ovs in override_lists]
        todo = [(k, ovs) for k, ovs in zip(keys, override_lists) if k not in self._verl_cache]
        if todo:
            try:
                results = validate_many([ovs for _, ovs in todo])
            except Exception as e:  # never take the tuner down: report it as the candidate's problem
                results = [[f"could not run verl's validation ({e})"] for _ in todo]
            for (k, _), res in zip(todo, results):
                self._verl_cache[k] = res
        return [self._verl_cache[k] for k in keys]

    # ------------------------------------------------------------------------------ runners

    def implicit_values(self) -> dict[str, Any]:
        """mart's filler values (catalogue defaults, GRPO settings, GPU count) that the user did not give.

        With the default entrypoint they are passed (verl needs e.g. a micro batch size and GRPO); with a
        user's own launcher (``--verl-entrypoint run.sh``) they are left off the command line unless a
        candidate changes them, so the script's own settings hold (the script's keys are in the base config
        anyway, imported from it).
        """
        if self.script is None:  # verl itself or a pass-through wrapper: mart's values are needed
            return {}
        cfg = {**SEARCH_SPACE.defaults(), **GRPO_BASE, "trainer.n_gpus_per_node": self.base_config().get(
            "trainer.n_gpus_per_node")}
        out = {}
        for k, v in cfg.items():
            if k in self.user_base:
                continue  # the script's (or base config's) own value: always passed, it is the same
            if k in self.script.unresolved_keys:
                out[k] = v  # the script sets it in a way mart could not read: its value holds
            elif k not in GRPO_BASE and k != "trainer.n_gpus_per_node" and VERL_DEFAULTS.get(k, v) == v:
                out[k] = v  # verl's own default: leaving it off changes nothing
            # else mart's value differs from verl's default (micro batch sizes, GRPO settings): passed, so
            # what runs is the config mart records
        return out

    def _runner(self) -> VerlRunner:
        options: dict[str, Any] = {
            "gpu_free_threshold_gb": None if self.ray_address else 2.0,
            "sample_gpu": self.ray_address is None,
            "implicit": self.implicit_values(),
            "schedule_steps": _int_or_none(self.user_base.get("trainer.total_training_steps")),
            "python": self.verl_python,
            **self.runner_options,
        }
        return VerlRunner(self.entrypoint, allowed_keys=self.allowed_keys(), watchdog=self.watchdog, **options)

    def make_runner(self) -> TrialRunner:
        runner = self._runner()
        if self.ray_address:
            from mart.trial_runner.ray.runner import RayJobRunner

            return RayJobRunner(self.ray_address, runner, **self.ray_runner_options())
        return runner

    def describe_job(self) -> JobDescription | None:
        """From ``actor_rollout_ref.model.path``'s config.json (a local directory) and the Hydra config;
        None when the model config cannot be read here (a hub id not downloaded) or the capacity is unknown."""
        from mart.state.job import JobDescription, ModelShape, Workload, hardware_from_name
        from mart.trial_runner.verl.space import cfg_get

        cfg = self.base_config()
        path = cfg.get("actor_rollout_ref.model.path")
        capacity = self.memory_capacity_gb()
        if not path or capacity is None:
            return None
        try:
            shape = ModelShape.from_config_file(Path(str(path)).expanduser())
        except ValueError:
            return None
        gpus = self._probe() if self.ray_address is None else []
        hardware = hardware_from_name(gpus[0].name if gpus else "gpu", capacity)
        uses_ref = bool(cfg_get(cfg, "actor_rollout_ref.actor.use_kl_loss")) or bool(cfg_get(cfg, "algorithm.use_kl_in_reward"))
        return JobDescription(
            model=shape, hardware=hardware, nnodes=int(cfg_get(cfg, "trainer.nnodes")),
            gpus_per_node=int(cfg_get(cfg, "trainer.n_gpus_per_node")),
            workload=Workload(train_batch_size=int(cfg_get(cfg, "data.train_batch_size")),
                              rollout_n=int(cfg_get(cfg, "actor_rollout_ref.rollout.n")),
                              max_prompt_length=int(cfg_get(cfg, "data.max_prompt_length")),
                              max_response_length=int(cfg_get(cfg, "data.max_response_length")),
                              uses_reference=uses_ref),
        )

def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value) if int(value) > 0 else None
    except (TypeError, ValueError):
        return None


def _check_key_list(cluster_version: str | None) -> None:
    """Refuse a cluster verl release whose keys the tuner cannot know (no verl here, another bundled list)."""
    if cluster_version is None:
        return
    from importlib import metadata

    from mart.trial_runner.verl._yaml_keys import VERL_VERSION

    try:
        here = metadata.version("verl")
    except metadata.PackageNotFoundError:
        here = None
    source = here or VERL_VERSION
    if str(cluster_version).strip() != source:
        what = f"verl {here} is installed here" if here else f"mart's bundled key list is verl {VERL_VERSION}'s"
        raise ConfigError(f"verl_version {cluster_version}: {what}, so Hydra's '+' prefixes could be wrong on the "
                          f"cluster; install verl=={cluster_version} on the tuner (pip install 'verl=={cluster_version}' "
                          "--no-deps suffices for the key list)")
