"""mart's ``local`` backend: the embedded GRPO workload, one OS process per trial."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mart.state.job import JobDescription
from mart.state.search_space import SearchSpace
from mart.trial_runner.base import Backend, TrialRunner
from mart.trial_runner.local.config import DEFAULTS, config_errors
from mart.trial_runner.ray.cluster import RayJobSizing

DEFAULT_MEMORY_CAPACITY_GB = 0.075
"""Emulated device memory, chosen from measurements (bench/local_workload.py, CPU workload memory):
the default config peaks near 0.038 GB (half of it); ppo_micro_batch_size_per_gpu 64 with gradient
checkpointing 0.054 GB and 32 without 0.059 GB (fit); the two fastest configs (micro 64 without
checkpointing with max_num_seqs 128, or dynamic batches of 2048 tokens) ~0.067 GB (approach);
micro 64 without checkpointing 0.080 GB and long padded responses 0.11+ GB (over: oom)."""


TEAM_MIN_TRAIN_BATCH_SIZE = 4
"""The fewest prompts per step a multi-agent job defaults to (a GRPO group per prompt and turn)."""
TEAM_STEP_ANSWERS = 2
"""A team step generates and trains at most this many times a single-agent step's answers by default."""


def team_workload_defaults(workflow: str, agents: int, rounds: int) -> dict[str, int]:
    """A multi-agent job's default prompts per step (and PPO mini batch). Each prompt makes agents x rounds
    answers in a debate and agents in a chain; the batch is the largest power of two that keeps a step at
    most ``TEAM_STEP_ANSWERS`` x a single-agent step's answers (16 prompts x rollout.n), at least
    ``TEAM_MIN_TRAIN_BATCH_SIZE``: debate 2x2 -> 8, debate 3x2 -> 4, chain of 2 -> 16, of 3 -> 8. So the
    session's budgets (trials x horizon steps) cost a team at most about twice what they cost one agent.
    Why not equal (debate 2x2 at 4 prompts): measured, the per-step rewards of 4 prompts are noisy enough
    that reward_collapse stopped all three stage-2 confirm trials of a default debate session (all on the
    same hard prompts at steps 22-24), while at 8 prompts no trial was stopped (docs/backends.md)."""
    answers = agents * (rounds if workflow == "debate" else 1)
    single = int(DEFAULTS["data.train_batch_size"])
    fit = TEAM_STEP_ANSWERS * single // answers
    batch = max(TEAM_MIN_TRAIN_BATCH_SIZE, 1 << max(0, fit.bit_length() - 1))
    mini = min(int(DEFAULTS["actor_rollout_ref.actor.ppo_mini_batch_size"]), batch)
    return {"data.train_batch_size": batch, "actor_rollout_ref.actor.ppo_mini_batch_size": mini}


class LocalBackend(RayJobSizing, Backend):
    """The embedded default workload.

    Args:
        memory_capacity_gb: emulated device memory (default ``DEFAULT_MEMORY_CAPACITY_GB``); a trial
            whose step peak exceeds it ends as ``oom``.
        ray_address: run each trial as a Ray job on this cluster (wraps the local runner).
        base_config: a YAML/JSON file of flat (or nested) verl-key overrides of the workload itself
            (model size, task, batch sizes): the baseline every candidate is applied to.
        workflow: ``debate`` or ``chain``: a multi-agent job (``team_config.py``, ``multi_agent.py``) of
            ``agents`` tiny policies (2 or 3; default 2) with per-agent knobs in the search space.
        agents: the number of agents of a multi-agent job.
        task: the embedded task (``local.task.name``): ``digit_sort`` (default) or ``digit_sort_long``, where
            answers lengthen as the policy learns, a cut answer scores 0 and ``data.max_response_length`` is a
            learning knob.
        entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources: with ``ray_address``, what each trial's
            job reserves (default: one CPU per trainer thread, ``local.num_threads``); Ray queues a trial until they
            are free on a node.

    Raises:
        ValueError: the base config file cannot be read or breaks the config's rules; an unknown
            workflow or number of agents.
    """

    name = "local"
    score_metric_prefix = "val-core/"

    def __init__(self, memory_capacity_gb: float | None = None, ray_address: str | None = None,
                 base_config: str | None = None, workflow: str | None = None, agents: int | None = None,
                 task: str | None = None, entrypoint_num_cpus: float | None = None,
                 entrypoint_num_gpus: float | None = None,
                 entrypoint_resources: dict[str, float] | None = None) -> None:
        from mart.trial_runner.local.team_config import MAX_AGENTS, WORKFLOWS, is_team_config, team_defaults

        self._capacity = memory_capacity_gb
        self.ray_address = ray_address
        self._init_ray_sizing(ray_address, entrypoint_num_cpus, entrypoint_num_gpus, entrypoint_resources)
        self._base = dict(DEFAULTS)
        file_values: dict[str, Any] = {}
        if base_config:
            from mart.state.config_values import load_config_file

            file_values = load_config_file(Path(base_config))  # ConfigError is a ValueError
            self._base.update(file_values)
        if task is not None:
            from mart.trial_runner.local.task import TASK_NAMES

            if task not in TASK_NAMES:
                raise ValueError(f"backend option `task` must be one of {list(TASK_NAMES)}, but got {task!r}.")
            self._base["local.task.name"] = task
        if agents is not None and workflow is None and not is_team_config(self._base):
            raise ValueError("backend option `agents` needs `workflow` (debate or chain).")
        if workflow is not None or is_team_config(self._base):
            workflow = workflow or str(self._base["workflow.name"])
            if workflow not in WORKFLOWS:
                raise ValueError(f"backend option `workflow` must be one of {list(WORKFLOWS)}, but got {workflow!r}.")
            n = int(agents if agents is not None else self._base.get("workflow.num_agents", 2))
            if not 2 <= n <= MAX_AGENTS:
                raise ValueError(f"backend option `agents` must be 2..{MAX_AGENTS}, but got {agents!r}.")
            # the team's defaults, then the file's own team keys (its per-agent values win)
            self._base.update(team_defaults(workflow, n, self._base))
            self._base.update({k: v for k, v in file_values.items() if k.startswith(("workflow.", "reward.", "agents."))})
            self._base["workflow.name"], self._base["workflow.num_agents"] = workflow, n
            if "data.train_batch_size" not in file_values:  # a debate step generates agents x rounds answers
                sized = team_workload_defaults(workflow, n, int(self._base["workflow.num_rounds"]))
                mini = file_values.get("actor_rollout_ref.actor.ppo_mini_batch_size")
                if mini is not None:  # the file's mini batch wins: the fewest whole mini batches >= the batch
                    mini = int(mini)
                    sized = {"data.train_batch_size": max(1, -(-sized["data.train_batch_size"] // mini)) * mini}
                self._base.update(sized)
        errors = self.validate_config(self._base)
        if errors:
            raise ValueError(f"base config {base_config or '(defaults)'}: " + " ".join(errors))

    @property
    def team(self) -> tuple[str, int] | None:
        """(workflow, agents) of a multi-agent job, else None."""
        if "workflow.name" not in self._base:
            return None
        return str(self._base["workflow.name"]), int(self._base["workflow.num_agents"])

    def search_space(self) -> SearchSpace:
        from mart.trial_runner.local.space import LONG_SEARCH_SPACE, SEARCH_SPACE, team_search_space

        if self.team is not None:
            return team_search_space(*self.team)
        return LONG_SEARCH_SPACE if self._base.get("local.task.name") == "digit_sort_long" else SEARCH_SPACE

    def base_config(self) -> dict[str, Any]:
        return dict(self._base)

    def validate_config(self, config: dict[str, Any]) -> list[str]:
        """Every error of a full flat config: unknown keys, types, ranges, batch arithmetic (and, for a
        multi-agent config, the team keys and whether the debate prompts fit)."""
        from mart.trial_runner.local.team_config import is_team_config, team_config_errors

        return team_config_errors(config)[1] if is_team_config(config) else config_errors(config)[1]

    def make_runner(self) -> TrialRunner:
        from mart.trial_runner.local.runner import LocalRunner

        runner = LocalRunner(memory_capacity_gb=self.memory_capacity_gb())
        if self.ray_address:
            from mart.trial_runner.ray.runner import RayJobRunner

            return RayJobRunner(self.ray_address, runner, **self.ray_runner_options())
        return runner

    def describe_job(self) -> JobDescription:
        """The tiny GPT's shape (GPT-2 MLP, 14-token vocabulary), the emulated device (a CPU: no vLLM;
        its "capacity" is the emulated limit) and the workload of the base config. A multi-agent job's
        agents all live in the trial's one process: ``agents`` policy copies share the device."""
        from mart.state.job import Hardware, ModelShape, Workload
        from mart.trial_runner.local.task import VOCAB_SIZE

        c = self._base
        h = int(c["local.model.n_embd"])
        return JobDescription(
            model=ModelShape(num_hidden_layers=int(c["local.model.n_layer"]), hidden_size=h,
                             num_attention_heads=int(c["local.model.n_head"]), intermediate_size=4 * h,
                             vocab_size=VOCAB_SIZE, gated_mlp=False),
            hardware=Hardware(name="cpu", memory_gb=float(self.memory_capacity_gb() or DEFAULT_MEMORY_CAPACITY_GB),
                              cpu=True),
            workload=Workload(train_batch_size=int(c["data.train_batch_size"]), rollout_n=int(c["actor_rollout_ref.rollout.n"]),
                              max_prompt_length=int(c["data.max_prompt_length"]),
                              max_response_length=int(c["data.max_response_length"]),
                              uses_reference=bool(c["actor_rollout_ref.actor.use_kl_loss"])),
            engine="hf",
            agents=self.team[1] if self.team else 1,
        )

    def _threads(self) -> int:
        """Torch threads of one trainer (``local.num_threads``, else ``$MART_NUM_THREADS``, else 1)."""
        return max(1, int(self._base.get("local.num_threads") or 0) or int(os.environ.get("MART_NUM_THREADS") or 1))

    def _ray_default_cpus(self) -> float | None:
        return self._threads()

    def max_parallel_trials(self) -> int | None:
        """One trainer process per core (each runs one torch thread unless ``local.num_threads`` says more): more
        at once would slow every trial, and stage 1 measures their speed. On a Ray cluster: the trials whose
        reservation (a CPU per thread by default) the cluster's nodes hold."""
        if self.ray_address:
            return self._ray_slots()
        return max(1, (os.cpu_count() or 1) // self._threads())

    def parallel_limit_reason(self) -> str:
        if self.ray_address:
            return self._ray_slots_reason()
        return f"{os.cpu_count() or 1} CPU core(s) here, {self._threads()} trainer thread(s) per trial"

    def memory_capacity_gb(self) -> float | None:
        """The emulated device memory. A multi-agent job keeps every agent's weights, AdamW state and
        reference in one process (the agents run one after another, so activations peak for one agent at
        a time): its default capacity adds each further agent's static memory to the single-agent default."""
        if self._capacity is not None:
            return self._capacity
        if self.team is None:
            return DEFAULT_MEMORY_CAPACITY_GB
        from mart.trial_runner.local.memory import static_agent_gb
        from mart.trial_runner.local.team_config import load_team_config

        team = load_team_config(self._base)
        return DEFAULT_MEMORY_CAPACITY_GB + (team.num_agents - 1) * static_agent_gb(team.base)
