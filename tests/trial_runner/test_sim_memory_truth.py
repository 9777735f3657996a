"""The simulator's memory truth (issue 42): torch's accounting of each scenario architecture, read from data.

The judge must not share the tuner's memory code: the simulator reads ``trial_runner/sim/memory_truth.json``
(precomputed by ``scripts/memory_truth.py sim``) and never imports the memory probe or the job model.
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import json
from pathlib import Path

import numpy as np
import pytest

import mart.trial_runner.sim as sim_pkg
from mart.nodes.agents.job_model import JobModel
from mart.trial_runner.sim import base_config, ground_truth, load_scenario
from mart.trial_runner.sim import memory as torch_memory
from mart.trial_runner.sim.backend import SimBackend
from mart.trial_runner.sim.job import GIB
from mart.trial_runner.sim.model import window_workloads
from mart.trial_runner.sim.system import FUSED_LOGITS_SAVING, knobs_from_config, simulate_step

SIM_DIR = Path(sim_pkg.__file__).resolve().parent
EXAMPLES = sorted(glob.glob(str(Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "*.yaml")))
SHIPPED = ["qwen3-8b-1x8", "qwen3-8b-2x8", "qwen3-0.6b-1x8", "qwen3-0.6b-2x8"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_the_simulator_imports_neither_the_probe_nor_the_tuners_memory_code():
    for path in SIM_DIR.glob("*.py"):
        bad = {n for n in _imports(path) if n.startswith("mart.nodes") or "memory_probe" in n
               or "memory_source" in n or "job_model" in n}
        assert not bad, f"{path.name} imports {bad}: the judge would share the tuner's memory code"


def test_every_shipped_and_example_scenario_model_has_torchs_accounting():
    for spec in SHIPPED + EXAMPLES:
        sc = load_scenario(spec)
        assert torch_memory.truth_for(sc) is not None, sc.model.name


def _update_gb(sc, overrides):
    cfg = {**base_config(sc), **overrides}
    k = knobs_from_config(cfg)
    w = window_workloads(sc, cfg, 1)[0]
    return float(np.asarray(simulate_step(sc, k, w)["mem_update"]).reshape(-1)[0])


def test_the_simulators_update_memory_moves_with_its_data_and_the_job_model_does_not(monkeypatch):
    sc = load_scenario("qwen3-8b-1x8")
    cfg = {"actor_rollout_ref.model.enable_gradient_checkpointing": False}
    job = SimBackend(scenario="qwen3-8b-1x8").describe_job()
    before_sim = _update_gb(sc, cfg)
    before_job = JobModel(job, base_config(sc)).predict(cfg).phase_gb["update_actor"]
    data = json.loads(torch_memory.DATA.read_text())
    for ck in ("0", "1"):
        for line in data["models"]["Qwen3-8B"]["update"][ck]:
            line["rest"][1] *= 2  # twice the bytes per token
    monkeypatch.setattr(torch_memory, "table", lambda: data)
    after_sim = _update_gb(sc, cfg)
    after_job = JobModel(job, base_config(sc)).predict(cfg).phase_gb["update_actor"]
    assert after_sim > before_sim * 1.3
    assert after_job == pytest.approx(before_job)


def test_the_simulators_update_peak_is_torchs_figure_plus_the_cuda_context():
    sc = load_scenario("qwen3-0.6b-1x8")
    entry = torch_memory.truth_for(sc)
    cfg = {"actor_rollout_ref.actor.use_dynamic_bsz": True, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 4096,
           "actor_rollout_ref.model.enable_gradient_checkpointing": False, "actor_rollout_ref.actor.strategy": "fsdp2"}
    got = _update_gb(sc, cfg)
    w = window_workloads(sc, {**base_config(sc), **cfg}, 1)[0]
    tokens = 4096  # the cap binds: far more tokens per GPU than one micro batch holds
    torch_gb = max(sum(line[p][0] + line[p][1] * tokens for p in ("sharded", "rest"))
                   for line in entry["update"]["0"]) / GIB
    # central constants; the 0.6 GB CUDA context; verl's entropy of the update's logits (2 bytes x vocab per token);
    # torch measured the non-fused fp32 log-prob path, verl's images run flash-attn's fused one (8 bytes x vocab less)
    entropy = 2 * sc.model.vocab * tokens / GIB if w.entropy_in_update else 0.0
    fused = FUSED_LOGITS_SAVING["update"] * sc.model.vocab * tokens / GIB
    assert got == pytest.approx(torch_gb + 0.6 + entropy - fused, rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("spec", SHIPPED + EXAMPLES)
def test_every_scenarios_optimum_fits_its_card_under_torchs_accounting(spec, monkeypatch):
    """The optimum the benchmark scores against, priced by the tuner-side accounting (the memory probe's shipped
    measurements through ``mart memory``'s job model): its training phases stay under the card."""
    sc = load_scenario(spec)
    gt = ground_truth(sc)
    job = SimBackend(scenario_file=spec if spec.endswith(".yaml") else None,
                     scenario=None if spec.endswith(".yaml") else spec).describe_job()
    model = JobModel(job, base_config(sc))
    if model.memory.source != "probe":
        pytest.skip(f"no shipped probe measurement for this cluster size: {model.memory.why}")
    pred = model.predict(gt["config"])
    for phase in ("old_log_prob", "update_actor"):
        assert pred.phase_gb[phase] <= sc.gpu.memory_gb, (phase, pred.phase_gb[phase])


def _gen(sc, overrides):
    cfg = {**base_config(sc), **overrides}
    w = window_workloads(sc, cfg, 1)[0]
    out = simulate_step(sc, knobs_from_config(cfg), w)
    return {k: float(np.asarray(out[k]).reshape(-1)[0]) for k in ("mem_gen", "mem_old")}


def test_kv_heads_per_rank_stop_shrinking_beyond_the_kv_heads():
    m = load_scenario("qwen3-8b-1x8").model  # 8 KV heads
    assert m.kv_bytes_per_rank_token(8) == m.kv_bytes_per_token / 8
    assert m.kv_bytes_per_rank_token(16) == m.kv_bytes_per_rank_token(8)  # a head per rank, replicated
    small = dataclasses.replace(m, kv_heads=2)
    assert small.kv_bytes_per_rank_token(4) == small.kv_bytes_per_rank_token(2) == small.kv_bytes_per_token / 2


def test_cuda_graphs_sit_inside_the_memory_share_from_vllm_0_21():
    sc = load_scenario("qwen3-8b-1x8")
    old, new = sc, dataclasses.replace(sc, vllm_version="0.21.0")
    cfg = {"actor_rollout_ref.rollout.enforce_eager": False}
    assert not old.graphs_inside_util and new.graphs_inside_util
    assert _gen(new, cfg)["mem_gen"] < _gen(old, cfg)["mem_gen"] - 0.3  # no longer on top of the share
    eager = {"actor_rollout_ref.rollout.enforce_eager": True}
    assert _gen(new, eager)["mem_gen"] == pytest.approx(_gen(old, eager)["mem_gen"])


def test_param_offload_does_not_lower_the_log_prob_peak():
    """verl reloads the actor's parameters for compute_log_prob."""
    sc = load_scenario("qwen3-8b-1x8")
    on = _gen(sc, {"actor_rollout_ref.actor.fsdp_config.param_offload": True})["mem_old"]
    assert on == pytest.approx(_gen(sc, {})["mem_old"])


def test_an_moe_scenario_holds_every_expert_and_computes_with_the_active_ones(tmp_path):
    text = Path(EXAMPLES[0]).read_text()
    import yaml

    data = yaml.safe_load(text)
    data["name"] = "moe"
    data["model"].update({"name": "Qwen3-30B-A3B", "num_parameters": 30.5e9, "num_hidden_layers": 48,
                          "hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 32,
                          "num_key_value_heads": 4, "head_dim": 128, "model_type": "qwen3_moe", "num_experts": 128,
                          "num_experts_per_tok": 8, "moe_intermediate_size": 768})
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(data))
    sc = load_scenario(str(path))
    assert sc.model.experts == 128 and 2.5e9 < sc.model.active_params < 4e9  # "A3B"
    job = SimBackend(scenario_file=str(path)).describe_job()
    assert job.model.num_experts == 128 and job.model.active_params < 0.2 * job.model.n_params
    bad = dict(data, model={**data["model"], "num_experts_per_tok": None})
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        load_scenario(str(path))
