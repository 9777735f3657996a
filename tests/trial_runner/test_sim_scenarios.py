"""Scenario files (YAML, validated), the model-mismatch option, and the ground truth over the expressible space."""

from __future__ import annotations

from pathlib import Path

import pytest

from mart.trial_runner.registry import load_backend
from mart.trial_runner.sim import (
    GPUS,
    SCENARIOS,
    ScenarioError,
    base_config,
    ground_truth,
    load_scenario,
    simulate,
)
from mart.trial_runner.sim.facts import step_phases
from mart.trial_runner.sim.scenarios import PERTURB_RANGES, perturbed_constants
from mart.trial_runner.verl.space import SEARCH_SPACE
from tests.support.paths import REPO

EXAMPLE = REPO / "examples" / "scenarios" / "llama-3.1-8b-2x8-a100.yaml"
GOOD = """
name: my-job
model: {name: M, num_hidden_layers: 24, hidden_size: 2048, intermediate_size: 5632, num_attention_heads: 16,
        num_key_value_heads: 4, vocab_size: 32000, num_parameters: 1.1e9}
cluster: {gpu: L40S, nodes: 1, gpus_per_node: 4}
workload: {train_batch_size: 64, rollout_n: 4, max_prompt_length: 512, max_response_length: 1024,
           mean_response_length: 400}
base_config: {actor_rollout_ref.rollout.tensor_model_parallel_size: 1, actor_rollout_ref.actor.ppo_mini_batch_size: 32}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_gpu_table_has_the_documented_gpus() -> None:
    assert {"H100-80GB", "H200", "A100-40GB", "A100-80GB", "H20", "L40S"} <= set(GPUS)
    assert GPUS["H200"].memory_gb > GPUS["H100-80GB"].memory_gb > GPUS["A100-40GB"].memory_gb
    assert GPUS["H20"].bf16_flops < GPUS["A100-80GB"].bf16_flops < GPUS["H100-80GB"].bf16_flops


def test_shipped_scenarios_are_files_with_the_mart_shapes() -> None:
    assert set(SCENARIOS) == {"qwen3-8b-1x8", "qwen3-8b-2x8", "qwen3-0.6b-1x8", "qwen3-0.6b-2x8"}
    sc = load_scenario("qwen3-8b-2x8")
    assert (sc.nnodes, sc.gpus_per_node, sc.gpu.name, sc.model.layers, sc.model.kv_bytes_per_token) == (
        2, 8, "H100-80GB", 36, 144 * 1024)
    assert load_scenario("qwen3-0.6b-1x8").model.kv_bytes_per_token == 112 * 1024
    job = sc.job()  # plain fields for a job description
    assert job["model"]["hidden_size"] == 4096 and job["cluster"]["gpu"] == "H100-80GB"
    assert job["workload"]["max_response_length"] == 2048


def test_a_user_file_loads_and_its_base_config_is_the_baseline(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, GOOD))
    assert sc.name == "my-job" and sc.n_gpus == 4 and sc.model.head_dim == 128 and sc.gpu.name == "L40S"
    cfg = base_config(sc)
    assert cfg["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 1
    assert cfg["trainer.n_gpus_per_node"] == 4 and cfg["actor_rollout_ref.rollout.n"] == 4
    assert simulate(cfg, sc, 3, seed=0).status == "completed"


@pytest.mark.parametrize("edit, field", [
    (("gpu: L40S", "gpu: B300"), "cluster.gpu"),
    (("num_hidden_layers: 24", "num_hidden_layers: 0"), "model.num_hidden_layers"),
    (("rollout_n: 4", "rollout_n: 1"), "workload.rollout_n"),
    (("mean_response_length: 400", "mean_response_length: 4000"), "workload"),
    (("tensor_model_parallel_size: 1", "tensor_model_parallel_size: 3"), "base_config"),
    (("num_key_value_heads: 4", "num_key_value_heads: 5"), "model"),
    (("num_parameters: 1.1e9}", "num_parameters: 1.1e9, rope: 1}"), "model.rope"),
    (("ppo_mini_batch_size: 32", "ppo_mini_batch_size: 128"), "base_config"),  # > train_batch_size: verl refuses
])
def test_a_bad_file_names_the_field(tmp_path: Path, edit: tuple[str, str], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(write(tmp_path, GOOD.replace(*edit)))
    assert f"  {field}:" in str(err.value) and "job.yaml" in str(err.value)


def test_unknown_name_and_missing_file() -> None:
    with pytest.raises(ValueError, match="qwen3-8b-1x8"):
        load_scenario("llama-70b")
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario("/nonexistent/job.yaml")


def test_perturb_changes_the_landscape_and_the_same_seed_reproduces_it() -> None:
    a, b, a2 = perturbed_constants(1), perturbed_constants(2), perturbed_constants(1)
    assert a == a2 and a != b
    for name, (lo, hi) in PERTURB_RANGES.items():
        assert lo <= getattr(a, name) <= hi
    base = load_scenario("qwen3-0.6b-1x8")
    p1, p2 = load_scenario("qwen3-0.6b-1x8", perturb=1), load_scenario("qwen3-0.6b-1x8", perturb=2)
    cfg = base_config(base)
    thr = [step_phases(cfg, sc)["throughput"] for sc in (base, p1, p2)]
    assert len({round(t) for t in thr}) == 3
    g1, g2 = ground_truth(p1), ground_truth(p2)
    assert g1["throughput"] != g2["throughput"]
    assert ground_truth(load_scenario("qwen3-0.6b-1x8", perturb=1)) == g1


def test_backend_takes_a_scenario_file_and_perturb() -> None:
    backend = load_backend("sim", scenario_file=str(EXAMPLE), perturb="7", seed=0)
    assert backend.scenario.name == "llama-3.1-8b-2x8-a100" and backend.scenario.perturb_seed == 7
    assert backend.memory_capacity_gb() == 80.0
    assert backend.base_config()["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 8
    assert backend.scenario.job()["cluster"]["nodes"] == 2
    with pytest.raises(ValueError, match="perturb"):
        load_backend("sim", scenario="qwen3-8b-1x8", perturb="abc")


def test_ground_truth_ties_the_log_prob_caps_and_returns_its_config() -> None:
    gt = ground_truth("qwen3-8b-1x8")
    cfg = gt["config"]
    assert SEARCH_SPACE.check_constraints(cfg) == []
    assert all(cfg.get(k) == v for k, v in gt["overrides"].items())
    # every key the optimum moves is a catalogue knob: a tuner can express it
    assert set(gt["overrides"]) <= {p.key for p in SEARCH_SPACE.params}
    # the optimum's throughput is what simulating its config gives (the log-prob caps follow the actor's)
    from mart.trial_runner.sim import expected_throughput

    thr, _ = expected_throughput(cfg, "qwen3-8b-1x8")
    assert thr == pytest.approx(gt["throughput"], rel=1e-9)
