"""SimBackend: the simulated verl cluster as a mart backend (``--backend sim``).

Search space = the verl catalogue (``trial_runner.verl.space.SEARCH_SPACE``); base config = verl's defaults plus
the scenario's job shape and the keys its file sets; memory capacity = the scenario's GPU memory. The
scenario is a shipped name (``scenario=``) or a user's YAML file (``scenario_file=``); ``perturb=SEED``
redraws the simulator's hidden constants (docs/sim.md, "Model mismatch"). ``time_scale`` defaults to one
baseline step ~= 0.04 wall seconds, so a stage-1 trial takes a fraction of a second.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mart.state.config_values import load_config_file
from mart.state.job import Hardware, JobDescription, ModelShape, Workload, known_gpu
from mart.state.search_space import SearchSpace
from mart.trial_runner.base import Backend
from mart.trial_runner.sim import model
from mart.trial_runner.sim.runner import SimRunner
from mart.trial_runner.sim.scenarios import SCENARIOS, Scenario, load_scenario

#: wall seconds one baseline step takes under the default time scale
DEFAULT_WALL_S_PER_STEP = 0.04


def nominal_step_seconds(scenario: str | Scenario, memory_capacity_gb: float | None = None) -> float:
    """Noise-free simulated duration of one baseline step (updates 3-5) of ``scenario``."""
    sc = load_scenario(scenario)
    cfg = model.base_config(sc)
    thr, _ = model.expected_throughput(cfg, sc, 6, memory_capacity_gb)
    if model.MA.is_multi_agent(sc):
        return model.MA.window_plans(sc, cfg, 6)[1].tokens / (thr * sc.total_gpus)
    w = model.window_workloads(sc, cfg, 6)[1]
    return w.tokens / (thr * sc.n_gpus)


class SimBackend(Backend):
    """A seeded model of a verl GRPO job on a named cluster scenario (see ``docs/sim.md``).

    Args:
        scenario: one of ``trial_runner.sim.SCENARIOS`` (``qwen3-8b-1x8``, ``qwen3-0.6b-2x8``, ...), a path to
            a scenario file, or a ``Scenario``.
        scenario_file: a YAML scenario file (docs/sim.md, "Scenario files"); overrides ``scenario``.
        perturb: seed of the hidden constants' draw (model mismatch); None = the documented central values.
        seed: the cluster's randomness (measurement noise, collapse draws); combined with each spec's seed.
        time_scale: simulated seconds per wall second (``wall`` clock); default: a baseline step ~0.04 s.
        memory_capacity_gb: override the GPU memory of the scenario (e.g. 40 to emulate A100-40GB).
        clock: ``wall`` (default) or ``poll`` (each poll advances ``steps_per_poll`` metric lines).
        steps_per_poll: cap on the metric lines one poll may reveal (default 1 with the poll clock).
        ray_address: accepted for CLI symmetry and ignored.
        noise_scale: multiplier of the timing measurement noise (default 1; 0: no jitter; ``bench/noise.py``
            runs 0, 1, 3 and 5).
        base_config: the user's base config (YAML/JSON of verl keys, e.g. from ``mart import-verl``): its keys replace
            the scenario's baseline values (catalogue knobs checked by the catalogue), so an imported job can be tried
            on the simulator; the cluster, the model and the workload's shape stay the scenario's.

    Example:
        >>> from mart.trial_runner.registry import load_backend
        >>> backend = load_backend("sim", scenario="qwen3-0.6b-1x8", seed=1)
        >>> backend.memory_capacity_gb()
        80.0
    """

    name = "sim"
    score_metric_prefix = "val-core/"

    def __init__(self, scenario: str | Scenario | None = None, seed: int = 0, time_scale: float | None = None,
                 memory_capacity_gb: float | None = None, ray_address: str | None = None, clock: str = "wall",
                 steps_per_poll: int | None = None, scenario_file: str | None = None,
                 perturb: int | str | None = None, base_config: str | None = None,
                 noise_scale: float | str | None = None) -> None:
        if perturb is not None and str(perturb).strip().lower() not in ("", "none", "null"):
            try:
                perturb = int(perturb)
            except (TypeError, ValueError):
                raise ValueError(f"`perturb` must be an integer seed, but got {perturb!r}.") from None
        else:
            perturb = None
        spec = scenario_file or scenario or "qwen3-8b-1x8"
        self.scenario = load_scenario(spec, perturb)
        if base_config:
            self.scenario = _with_base_config(self.scenario, Path(base_config))
        if noise_scale is not None and str(noise_scale).strip() != "":
            try:
                scale = float(noise_scale)
            except (TypeError, ValueError):
                raise ValueError(f"`noise_scale` must be a number >= 0, but got {noise_scale!r}.") from None
            self.scenario = self.scenario.with_noise(scale)
        self.perturb = perturb
        self.seed = int(seed)
        self._capacity = float(memory_capacity_gb) if memory_capacity_gb is not None else None
        if time_scale is None:
            time_scale = nominal_step_seconds(self.scenario, self._capacity) / DEFAULT_WALL_S_PER_STEP
        self.time_scale = float(time_scale)
        self.clock = clock
        self.steps_per_poll = steps_per_poll
        self._runner_args = (self.scenario, self.seed, self.time_scale, self._capacity, clock, steps_per_poll)
        SimRunner(*self._runner_args)  # validate the clock options now, not at the first trial

    def search_space(self) -> SearchSpace:
        return model.search_space(self.scenario)  # verl's; a multi-agent scenario's own catalogue

    def base_config(self) -> dict[str, Any]:
        return model.base_config(self.scenario)

    def memory_capacity_gb(self) -> float | None:
        return self._capacity if self._capacity is not None else self.scenario.gpu.memory_gb

    def describe_job(self) -> JobDescription:
        """The scenario as a user would describe it (``Scenario.job()``: config.json fields, the GPU's
        datasheet figures, the cluster, the workload). None of the simulator's cost constants crosses over."""
        job = self.scenario.job()
        m, c, w = job["model"], job["cluster"], job["workload"]
        # "PCIe Gen4 only (no NVLink)" names NVLink too: only a link it has counts
        link = str(c.get("interconnect", "")).lower()
        nvlink = "nvlink" in link and "no nvlink" not in link
        return JobDescription(
            model=ModelShape(num_hidden_layers=m["num_hidden_layers"], hidden_size=m["hidden_size"],
                             intermediate_size=m["intermediate_size"], num_attention_heads=m["num_attention_heads"],
                             num_key_value_heads=m["num_key_value_heads"], head_dim=m.get("head_dim"),
                             vocab_size=m["vocab_size"], params=m["num_parameters"],
                             model_type=m.get("model_type"), tie_word_embeddings=bool(m.get("tie_word_embeddings")),
                             num_experts=m.get("num_experts"), num_experts_per_tok=m.get("num_experts_per_tok"),
                             moe_intermediate_size=m.get("moe_intermediate_size")),
            hardware=Hardware(name=c["gpu"], memory_gb=self.memory_capacity_gb() or c["memory_gb"],
                              bf16_flops=c["bf16_tflops"] * 1e12, hbm_bandwidth=c["hbm_tb_s"] * 1e12,
                              # a GPU without NVLink runs its collectives over PCIe (datasheet order of magnitude)
                              intra_node_bandwidth=None if nvlink else 16e9,
                              # the host link's generation, from the datasheet table a verl job's GPU name reads
                              pcie_gen=row[2] if (row := known_gpu(c["gpu"])) else None),
            nnodes=c["nodes"], gpus_per_node=c["gpus_per_node"], vllm_version=job["versions"]["vllm"],
            workload=Workload(train_batch_size=w["train_batch_size"], rollout_n=w["rollout_n"],
                              max_prompt_length=w["max_prompt_length"], max_response_length=w["max_response_length"],
                              prompt_length_mean=w.get("mean_prompt_length"),
                              response_length_mean=w.get("mean_response_length")),
        )

    def make_runner(self) -> SimRunner:
        return SimRunner(*self._runner_args)

    def ground_truth(self, margin: float = 0.1, horizon: int = 6) -> dict[str, Any]:
        """The simulator's best stage-1 config for this scenario (see ``model.ground_truth``)."""
        return model.ground_truth(self.scenario, margin, horizon, self._capacity)


def _with_base_config(sc: Scenario, path: Path) -> Scenario:
    """``sc`` with the keys of the user's base config file on top of its own (``ValueError`` naming the file and the
    key: a catalogue knob out of its range, a baseline that breaks verl's rules)."""
    values = load_config_file(path)  # ConfigError is a ValueError
    space = model.search_space(sc)
    errors = []
    for key, value in values.items():
        if key in space:
            try:
                values[key] = space[key].validate(value)
            except ValueError as e:
                errors.append(str(e))
    merged = dataclasses.replace(sc, base_overrides=tuple(sorted({**dict(sc.base_overrides), **values}.items())))
    errors += space.check_constraints(model.base_config(merged))
    if errors:
        raise ValueError(f"base config {path}: " + " ".join(errors))
    return merged


__all__ = ["SCENARIOS", "SimBackend", "nominal_step_seconds"]
