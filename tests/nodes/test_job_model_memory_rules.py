"""Issue 42's rules in the tuner's job model: KV heads per TP rank, vLLM's CUDA graphs by version, verl's reload of
offloaded parameters for the log-prob pass, the probe as the training phases' source, MoE, the GPU table."""

from __future__ import annotations

import numpy as np
import pytest

from mart.nodes.agents.job_model import JobModel
from mart.state.job import JobDescription, ModelShape, Workload, gpu_memory, hardware_from_name, known_gpu

QWEN3_8B = dict(num_hidden_layers=36, hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, model_type="qwen3")
WL = Workload(train_batch_size=256, rollout_n=8, max_prompt_length=1024, max_response_length=2048,
              response_length_mean=800)


def _job(**kw) -> JobDescription:
    model = ModelShape(**{**QWEN3_8B, **kw.pop("model", {})})
    return JobDescription(model=model, hardware=hardware_from_name("H100-80GB", 80), nnodes=1, gpus_per_node=8,
                          workload=WL, **kw)


def test_kv_bytes_per_rank_stop_shrinking_beyond_the_kv_heads():
    jm = JobModel(_job())
    per = [float(jm._kv_rank_bytes(np.array([tp]))[0]) for tp in (1, 2, 4, 8, 16)]
    assert per[:4] == [jm.kv_bytes, jm.kv_bytes / 2, jm.kv_bytes / 4, jm.kv_bytes / 8]
    assert per[4] == per[3]


def test_cuda_graphs_move_inside_the_share_with_vllm_0_21():
    cfg = {"actor_rollout_ref.rollout.enforce_eager": False}
    old = JobModel(_job()).predict(cfg)
    new = JobModel(_job(vllm_version="0.21.0")).predict(cfg)
    assert new.phase_gb["gen"] < old.phase_gb["gen"] - 0.2


@pytest.mark.parametrize("probe", ["cached", "0"])
def test_param_offload_keeps_the_parameters_in_the_log_prob_pass(monkeypatch, probe):
    monkeypatch.setenv("MART_MEMORY_PROBE", probe)
    jm = JobModel(_job())
    assert jm.memory.source == ("probe" if probe == "cached" else "formula")
    on = jm.predict({"actor_rollout_ref.actor.fsdp_config.param_offload": True}).phase_gb["old_log_prob"]
    assert on == pytest.approx(jm.predict({}).phase_gb["old_log_prob"])


def test_the_probe_sees_more_than_the_textbook_without_checkpointing(monkeypatch):
    cfg = {"actor_rollout_ref.model.enable_gradient_checkpointing": False,
           "actor_rollout_ref.actor.use_dynamic_bsz": True, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384}
    # the same (non-fused) log-prob path on both sides: the difference is the saved activations
    probed = JobModel(_job(logits_path="fp32")).predict(cfg).phase_gb["update_actor"]
    monkeypatch.setenv("MART_MEMORY_PROBE", "0")
    formula = JobModel(_job(logits_path="fp32")).predict(cfg).phase_gb["update_actor"]
    assert probed > 1.1 * formula


def test_an_moe_model_counts_every_expert_and_computes_with_the_active_ones():
    moe = ModelShape(num_hidden_layers=48, hidden_size=2048, intermediate_size=6144, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, vocab_size=151936, model_type="qwen3_moe", num_experts=128,
                     num_experts_per_tok=8, moe_intermediate_size=768)
    assert 29e9 < moe.n_params < 32e9 and 2.5e9 < moe.active_params < 4e9  # Qwen3-30B-A3B


def test_b200_l4_a10g_are_in_the_gpu_table():
    assert known_gpu("NVIDIA B200")[0] == 2250e12 and gpu_memory("B200") == 180
    assert known_gpu("NVIDIA L4")[1] == 0.3e12 and gpu_memory("L4") == 24
    assert known_gpu("NVIDIA L40S")[0] == 362e12  # not taken for an L4
    assert known_gpu("NVIDIA A10G")[0] == 125e12 and gpu_memory("A10G") == 24
